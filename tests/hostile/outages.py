"""Object storage that hangs or restarts (issue 45, items 8-9): point 23. Tests:
``tests/test_remote_outages.py`` (a loopback server in the test that speaks enough S3 to serve a
dataset folder, and hangs or refuses on purpose)."""

from __future__ import annotations

from tests.hostile import Case

HANG = "test_remote_outages::test_a_server_that_never_answers_fails_within_the_bound"
DEFAULTS = "test_remote_outages::test_the_default_policy_outlasts_a_restart"
RESTART = "test_remote_outages::test_a_server_that_comes_back_is_survived"

CASES = [
    Case(
        "server-never-answers-index",
        23,
        "a server that accepts connections and never answers, from the first request "
        "(`ShardDataset(url)`, small documented timeouts)",
        "`RemoteError` ('the endpoint does not answer') within `RetryPolicy.bound_s()` "
        "(`total_s + connect_timeout_s + timeout_s`); the process exits at once",
        HANG,
        "all",
    ),
    Case(
        "server-never-answers-shards",
        23,
        "a server that serves `index.json`, then accepts shard requests and never answers",
        "the first error within one bound (the read takes its prefetch's error; was: two "
        "bounds, 240.7 s at the defaults) and the process exits within 2 s of it (prefetch "
        "threads are daemons; was: 482.5 s)",
        HANG,
        "shards",
    ),
    Case(
        "server-restart-30s-default-policy",
        23,
        "connections refused for 30 s (a server restart), the default `RetryPolicy`",
        "the request succeeds once the server is back (retries until `total_s`=120; was: "
        "given up after 5 attempts, 3.0 s)",
        DEFAULTS,
        (30.0, True),
    ),
    Case(
        "server-outage-beyond-total",
        23,
        "connections refused for 10 minutes, the default `RetryPolicy`",
        "`RemoteError` '(gave up after N attempt(s))' once `total_s` (120 s) has passed, never "
        "later than it",
        DEFAULTS,
        (600.0, False),
    ),
    Case(
        "server-refuses-then-returns",
        23,
        "a real loopback server down (connections refused) for 3 s, then up, while a dataset is "
        "opened with no `attempts` given",
        "the open waits it out and succeeds",
        RESTART,
        3.0,
    ),
]
