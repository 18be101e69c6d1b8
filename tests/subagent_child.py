"""A runtime process for the sub-agent crash test.

Usage: python subagent_child.py DB_URL LOG_PATH LIFE

Life 1 creates a parent session and asks it to start a child; the parent's
turn for the child's result hangs (the test kills the process there).
Later lives let it finish. Every turn appends "LIFE WHO MESSAGE_ID" to the log.
"""

from __future__ import annotations

import sys
import threading

from kinbox.actors import Runtime, Turn


def main() -> None:
    url, log_path, life = sys.argv[1:]
    log = open(log_path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
    never = threading.Event()

    def brain(turn: Turn) -> None:
        message = turn.messages[0]
        if turn.session_id.startswith("subagent-"):
            log.write(f"{life} child {message.message_id}\n")
            turn.reply("child result: 7 files cleaned")
        elif message.kind == "subagent_result":
            log.write(f"{life} parent-woken {message.message_id}\n")
            if life == "1":
                never.wait()  # killed here, after the child's commit
            turn.reply(f"thanks for: {message.content}")
        else:
            turn.tools.agent(description="clean the temp files")
            log.write(f"{life} parent-start {message.message_id}\n")

    with Runtime(db=url, brain=brain, tick_interval=0.05) as rt:
        if life == "1":
            project = rt.create_project("crashy")
            rt.create_session(project.id, "Parent", session_id="parent")
            rt.post("parent", "start a helper")
            print("ready", flush=True)
            never.wait()
        rt.run_until_idle(timeout=60)
    print("done", flush=True)


if __name__ == "__main__":
    main()
