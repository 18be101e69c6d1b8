"""Fill a kinbox PostgreSQL database with a backlog the way `kinbox bench scaleout` does
(its producer: one send-only runtime, `journal.enqueue_many` in transactions of 2,000,
then ANALYZE). Usage: python docs/experiments/hot_lease_fill.py URL [MESSAGES] [SESSIONS]
"""

import sys

from kinbox.actors.bench_scaleout import PAYLOAD
from kinbox.actors.bench_scaleout_systems import Producer

url = sys.argv[1]
messages = int(sys.argv[2]) if len(sys.argv) > 2 else 50_000
sessions = int(sys.argv[3]) if len(sys.argv) > 3 else 1_000
producer = Producer("kinbox", url, sessions, PAYLOAD)
try:
    producer.backlog(messages)
    print("pending:", producer.remaining())
finally:
    producer.close()
