#!/usr/bin/env bash
# Set up a fresh Debian machine, then run the linters and the whole test suite:
# unit tests and the integration suite against a real RabbitMQ ($RABBITMQ_URL,
# else testcontainers where Docker answers, else local nodes the tests start).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
echo "==> ruff"
.venv/bin/ruff check src tests bench
echo "==> mypy --strict"
.venv/bin/mypy
echo "==> mkdocs build --strict"
site=$(mktemp -d)
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir "$site"
rm -rf "$site"
echo "==> pytest"
# The tests' temporary files (every local node's data folder, the stores' servers, the
# clients' files) go to a folder of their own on /dev/shm where it is a tmpfs with room:
# a node's writes and fsyncs then cost no disk I/O (the same subset ran 7 % faster,
# docs/project/tests.md). DELAYQ_TEST_TMPDIR names another parent; TMPDIR set is kept.
tmp_parent=${DELAYQ_TEST_TMPDIR:-}
if [ -z "$tmp_parent" ] && [ -z "${TMPDIR:-}" ] \
    && [ "$(stat -f -c %T /dev/shm 2>/dev/null)" = tmpfs ] \
    && [ "$(df --output=avail -k /dev/shm | tail -n 1)" -gt $((4 * 1024 * 1024)) ]; then
    tmp_parent=/dev/shm
fi
if [ -n "$tmp_parent" ]; then
    TMPDIR=$(mktemp -d "$tmp_parent/delayq-tests.XXXXXX")
    chmod 1777 "$TMPDIR"  # the PostgreSQL server a test starts runs as postgres
    export TMPDIR
    # Spark's scratch folders (blockmgr-*, spark-*) go there too: a JVM a test kills
    # leaves them behind, and Spark reads SPARK_LOCAL_DIRS, not TMPDIR.
    export SPARK_LOCAL_DIRS=$TMPDIR
    trap 'rm -rf "$TMPDIR"' EXIT
    echo "==> temporary files in $TMPDIR"
fi
# Three workers (each with its own local node) keep two cores busy; a fourth made a pass
# slower (docs/project/tests.md). DELAYQ_TEST_WORKERS=0 runs them in one process.
# --dist loadgroup: the Spark tests (one xdist group, tests/spark/conftest.py) share one
# worker and its JVM; every other test goes to whichever worker is free.
# --max-worker-restart 0: a worker that dies (a test past its timeout ends it) fails the
# run at once; replaced, its successor could leave xdist waiting with no progress.
workers=(-n "${DELAYQ_TEST_WORKERS:-3}" --dist loadgroup --max-worker-restart 0)
if [ "$#" -gt 0 ]; then
    status=0
    .venv/bin/python -m pytest -p no:cacheprovider "${workers[@]}" "$@" || status=$?
    exit "$status"
fi
# Everything but the three-node cluster scenario on the installed server (Debian 12's
# 3.10.8, the oldest supported), then the broker-facing suites again on RabbitMQ 4.3.x (the
# newest, from Debian testing) and a named subset on 4.0.5 (Debian 13), each from the tree
# setup.sh builds (DELAYQ_RABBITMQ_SERVER picks the server of every local node), then the
# cluster scenario alone on each: its three nodes beside the workers' would leave two cores
# too busy for the timing checks. DELAYQ_TEST_SERVERS="installed" runs one server.
# The 4.0.5 subset (docs/project/tests.md says why): the suites that test the contract and
# the misuses, the version-dependent faults, and every integration test whose outcome depends on the server's
# version (permissions, delivery counting, frame sizes, headers, quorum queue limits, TLS),
# without the Spark jobs (their publishing is the same on every server, and 3.10.8 and 4.3
# run them).
# Each stage has a limit well above its usual time (about 15, 15, 5 and 3 minutes): a stage
# still running then is interrupted (pytest prints what ran and where it stood) instead of
# holding CI to its own limit; one test alone is limited too (pyproject.toml: timeout).
servers=(${DELAYQ_TEST_SERVERS:-installed 4.3 4.0})
broker_suites=(tests/integration tests/contract tests/misuse tests/faults tests/spark)
# The fault scenarios there are the version-dependent ones (the broker's consumer timeout,
# a full quorum tier); the others (restarts, closed connections, SIGKILLs, alarms) test the
# client's recovery, which 3.10.8 and 4.3 bound, and a 4.0.5 cluster held 293,850 messages
# through node kills.
subset_4_0=(tests/contract tests/misuse tests/faults/test_consumer_timeout.py
            tests/faults/test_dramatiq_consumer_timeout.py
            tests/faults/test_faults.py::test_handler_slower_than_the_broker_consumer_timeout
            tests/faults/test_faults.py::test_full_tier_rejects_publishes_and_nothing_is_half_published)
for name in grant limits parked_browse verify xdeath_cycle put_back_limit frame_feed \
        frame_max intake intake_poison intake_replay consumer_poison poison tls cli_parked \
        cli_parked_ids exact local_main dramatiq taskiq faststream celery frameworks_guide; do
    subset_4_0+=("tests/integration/test_$name.py")
done
status=0
started=$(date +%s)
for server in "${servers[@]}"; do
    if [ "$server" = "${servers[0]}" ]; then
        echo "==> pytest, everything but -m cluster (RabbitMQ: $server)"
        suites=()
        marks="not cluster"
    elif [ "$server" = 4.0 ]; then
        echo "==> pytest, the version-dependent subset but -m cluster or spark (RabbitMQ: $server)"
        suites=("${subset_4_0[@]}")
        marks="not cluster and not spark and not bench"
    else
        # -m bench (the documented benchmark commands run, about a minute): on the first
        # server only; what they check (each command runs from the documented install and
        # prints its figures) is the scripts', the same on every server.
        echo "==> pytest, the broker-facing suites but -m cluster or bench (RabbitMQ: $server)"
        suites=("${broker_suites[@]}")
        marks="not cluster and not bench"
        # The web-app guide's app servers (gunicorn's workers, Flask, Django) differ in the
        # web framework, not in what reaches the broker: uvicorn's app alone here.
        for app in gunicorn-uvicorn flask django; do
            suites+=(--deselect "tests/integration/test_web_guide.py::test_each_answered_request_is_a_message_held_once[$app]")
        done
        # Client-side recovery of the Spark jobs (a killed job resumed, an outage waited
        # out, spark-submit on a cluster, a stream through SIGKILLs: about 450
        # worker-seconds), of a publisher killed between its schedule index's writes
        # (about 40), and the task frameworks' guide examples (their own CLIs) on the
        # first server only: what reaches the broker (bulk scheduling, records, each
        # framework's delays, retries and DLQ) runs here by the other Spark and framework tests.
        for slow in tests/spark/test_stream.py tests/spark/test_cluster.py \
                tests/spark/test_outage.py tests/spark/test_cli_outage.py \
                tests/spark/test_resume_killed.py tests/spark/test_job_failure.py \
                tests/misuse/test_spark_resume.py tests/integration/test_frameworks_guide.py \
                tests/integration/test_schedule_kill.py \
                tests/integration/test_cli_cancel_servers.py \
                "tests/integration/test_readme_examples.py::test_the_block_runs[spark.md"; do
            suites+=(--deselect "$slow")
        done
        if [ "$server" = "${servers[1]:-}" ]; then
            # With them, on uvloop as they are, the unit tests that run an event loop.
            suites+=($(grep -l -E "asyncio|async def|delayq\.aio|Bridge|Worker" tests/unit/*.py))
        fi
    fi
    # The event loop of every async test (tests/loops.py): asyncio's on the first server,
    # uvloop (uvicorn's default) on the others, so that each async path runs on both.
    loop=uvloop
    [ "$server" = "${servers[0]}" ] && loop=asyncio
    echo "==> async tests on the $loop event loop"
    # The fault scenarios' lengths (tests/faults/test_faults.py): half their whole length
    # on every server (the same faults, 15 connection closes instead of 30, 5 SIGKILLs
    # among 10,000 messages instead of 20,000); `bash scripts/test.sh tests/faults` runs
    # them whole.
    scale=(DELAYQ_FAULT_CLOSE_SECONDS=30 DELAYQ_FAULT_SIGKILL_MESSAGES=10000
           DELAYQ_FAULT_RESTART_MESSAGES=10000)
    # --durations: every test over 8 s is listed, to see where a stage's time goes.
    env "${scale[@]}" DELAYQ_RABBITMQ_SERVER="$server" DELAYQ_TEST_LOOP="$loop" \
        timeout --signal=INT --kill-after=120 55m \
        .venv/bin/python -m pytest -p no:cacheprovider "${workers[@]}" -m "$marks" \
        --durations=0 --durations-min=8 "${suites[@]}" || status=$?
    echo "==> elapsed: $(( ($(date +%s) - started) / 60 )) min"
done
# The cluster scenario on 3.10.8 and 4.3.x, not on 4.0.5: a 4.0.5 cluster held 293,850
# messages through two node kills (docs/project/reliability.md), and nothing of it
# depends on a version between the two that run it (docs/project/tests.md).
# Only the files that can hold a cluster test are collected (collecting every suite to
# select three tests took 13 s a stage): those marking tests `cluster`, and the docs'
# blocks (tests/integration/test_readme_examples.py marks those that start a cluster).
mapfile -t cluster_files < <(grep -rlE "mark\.cluster|\"cluster\"" tests --include='test_*.py')
for server in "${servers[@]}"; do
    if [ "$server" = 4.0 ] && [ "${#servers[@]}" -gt 1 ]; then
        continue
    fi
    loop=uvloop
    [ "$server" = "${servers[0]}" ] && loop=asyncio
    echo "==> pytest -m cluster (alone, RabbitMQ: $server, $loop event loop)"
    DELAYQ_RABBITMQ_SERVER=$server DELAYQ_TEST_LOOP=$loop timeout --signal=INT --kill-after=120 20m \
        .venv/bin/python -m pytest -p no:cacheprovider -m cluster "${cluster_files[@]}" \
        || status=$?
    echo "==> elapsed: $(( ($(date +%s) - started) / 60 )) min"
done
exit "$status"
