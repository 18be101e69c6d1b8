"""kinbox.transport: what crosses a process boundary (peer links, the HTTP app).

Nothing lives here yet: the peer protocol and the HTTP API arrive with their
issues. The package exists so the layering rule (transport never imports
actors or persistence) is checked from the first commit.
"""

__all__: list[str] = []
