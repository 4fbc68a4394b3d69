"""The Redis and PostgreSQL idempotency stores against real servers.

Every behaviour case of the unit suite (``tests/unit/test_idempotency.py``, the tests
that take a ``store``) runs here again against both stores, through this module's
``store`` fixture; then exclusivity across processes, Redis leases and retention in
real time, PostgreSQL reconnection and DSN redaction, and the local-server harness.
The servers come from the ``redis_url`` and ``postgres_dsn`` fixtures (environment,
else throwaway local servers).
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from delayq.errors import StoreError
from delayq.local.node import free_port
from delayq.pytest_plugin import _in_ci
from delayq.stores.base import ClaimStatus, IdempotencyStore
from tests.integration import store_servers as servers
from tests.unit import test_idempotency as unit_suite

# the servers' store fixtures (tests/integration/store_servers.py)
postgres_store = servers.postgres_store
redis_client = servers.redis_client
redis_store = servers.redis_store

CLAIMED, DONE, BUSY = ClaimStatus.CLAIMED, ClaimStatus.DONE, ClaimStatus.BUSY

# --- the unit suite's behaviour cases, collected again in this module ----------------------------

BEHAVIOUR = servers.contract_cases(unit_suite, "store", "tx_store")
globals().update(BEHAVIOUR)


def test_the_shared_behaviour_suite_was_picked_up():
    assert len(BEHAVIOUR) >= 8, sorted(BEHAVIOUR)


def _now_ms() -> int:
    return int(time.time() * 1000)


@pytest.fixture(params=["redis", "postgres"])
def store(request: pytest.FixtureRequest) -> IdempotencyStore:
    """The store the shared behaviour cases run against (closed by its factory)."""
    factory: Callable[..., IdempotencyStore] = request.getfixturevalue(f"{request.param}_store")
    return factory()


@pytest.fixture
def tx_store(postgres_store: Callable[..., Any], postgres_dsn: str) -> Iterator[Any]:
    """The transactional cases on PostgreSQL (Redis cannot commit a handler's writes)."""
    psycopg = servers.client_module("psycopg", "postgres")
    store = postgres_store()
    effects = f"effects_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {effects} (key TEXT)")

    def write(tx: Any, key: str) -> None:
        tx.execute(f"INSERT INTO {effects} VALUES (%s)", (key,))

    def count(key: str) -> int:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            row = conn.execute(f"SELECT COUNT(*) FROM {effects} WHERE key = %s", (key,))
            return int(row.fetchone()[0])

    yield unit_suite.TxHarness(store, write, count)
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {effects}")


def test_redis_is_not_a_transactional_store(redis_store):
    from delayq.stores.base import supports_transactions

    assert not supports_transactions(redis_store())


# --- exclusive across processes ------------------------------------------------------------------


def _claim_all(kind: str, where: str, name: str, keys: list[str], start: Any, out: Any) -> None:
    if kind == "redis":
        from delayq.stores.redis import RedisStore

        store: IdempotencyStore = RedisStore(where, prefix=name)
    else:
        from delayq.stores.postgres import PostgresStore

        store = PostgresStore(where, table=name)
    results = []
    for n, key in enumerate(keys):
        if n % 10 == 0:
            start.wait(60)  # keep the processes in step: they race for the same keys
        results.append((key, store.claim(key, lease_ms=60_000, now_ms=0).value))
    store.close()
    out.put(results)


@pytest.mark.parametrize("kind", ["redis", "postgres"])
def test_claims_are_exclusive_across_processes(kind, request):
    made = request.getfixturevalue(f"{kind}_store")()  # creates the table, cleans up after
    where = request.getfixturevalue("redis_url" if kind == "redis" else "postgres_dsn")
    name = made.prefix if kind == "redis" else made.table
    keys = [f"k{n}" for n in range(300)]
    ctx = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    start, out = ctx.Barrier(4), ctx.Queue()
    procs = [
        ctx.Process(target=_claim_all, args=(kind, where, name, keys, start, out)) for _ in range(4)
    ]
    for proc in procs:
        proc.start()
    results = [pair for _ in procs for pair in out.get(timeout=60)]
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    won = sorted(k for k, status in results if status == "claimed")
    assert won == sorted(keys), "a key was claimed twice or not at all"
    assert sum(status == "busy" for _, status in results) == 3 * len(keys)


# --- Redis: leases and retention in real time ----------------------------------------------------


def test_redis_lease_expires_in_real_time(redis_store):
    store = redis_store()
    assert store.claim("k", lease_ms=300, now_ms=_now_ms()) is CLAIMED
    assert store.claim("k", lease_ms=300, now_ms=_now_ms()) is BUSY
    time.sleep(0.4)
    assert store.claim("k", lease_ms=300, now_ms=_now_ms()) is CLAIMED
    assert store.claim("k", lease_ms=300, now_ms=_now_ms()) is BUSY


def test_redis_forgets_a_crashed_claim_by_its_ttl(redis_store, redis_client):
    store = redis_store()
    assert store.claim("k", lease_ms=300, now_ms=0) is CLAIMED
    assert 0 < redis_client.pttl(store.prefix + "k") <= 300
    time.sleep(0.4)
    assert redis_client.exists(store.prefix + "k") == 0
    # the caller's clock stood still, yet Redis ended the lease: the key is free again
    assert store.claim("k", lease_ms=300, now_ms=0) is CLAIMED


def test_redis_completed_key_outlives_its_lease_and_has_no_ttl(redis_store, redis_client):
    store = redis_store()
    assert store.claim("k", lease_ms=100, now_ms=_now_ms()) is CLAIMED
    store.complete("k", now_ms=_now_ms())
    assert redis_client.pttl(store.prefix + "k") == -1
    time.sleep(0.2)
    assert store.claim("k", lease_ms=100, now_ms=_now_ms()) is DONE
    store.release("k")
    assert store.claim("k", lease_ms=100, now_ms=_now_ms()) is DONE


def test_redis_retention_expires_completed_keys_and_prune_then_finds_nothing(
    redis_store, redis_client
):
    store = redis_store(retention_ms=300)
    assert store.claim("k", lease_ms=60_000, now_ms=_now_ms()) is CLAIMED
    store.complete("k", now_ms=_now_ms())
    assert 0 < redis_client.pttl(store.prefix + "k") <= 300
    assert store.claim("k", lease_ms=60_000, now_ms=_now_ms()) is DONE
    time.sleep(0.4)
    assert store.prune(older_than_ms=_now_ms() + 10**6) == 0
    assert store.claim("k", lease_ms=60_000, now_ms=_now_ms()) is CLAIMED


def test_redis_prune_scans_past_one_batch_and_keeps_other_keys(redis_store, redis_client):
    store, neighbour = redis_store(), redis_store()
    for n in range(1_100):
        store.complete(f"k{n}", now_ms=0)
    neighbour.complete("k0", now_ms=0)
    redis_client.set(store.prefix + "not-a-hash", "left alone")
    assert store.prune(older_than_ms=1) == 1_100
    assert store.prune(older_than_ms=1) == 0
    assert neighbour.claim("k0", lease_ms=1_000, now_ms=0) is DONE
    assert redis_client.get(store.prefix + "not-a-hash") == b"left alone"


def test_redis_prefix_with_glob_characters_is_matched_literally(redis_store):
    store = redis_store(prefix=f"delayq:test:{uuid.uuid4().hex[:8]}:[a]*?:")
    store.complete("k", now_ms=0)
    assert store.prune(older_than_ms=1) == 1


def test_redis_store_over_a_given_client_leaves_it_open(redis_url, redis_client):
    from delayq.stores.redis import RedisStore

    prefix = f"delayq:test:{uuid.uuid4().hex[:12]}:"
    store = RedisStore(redis_client, prefix=prefix)
    assert store.claim("k", lease_ms=1_000, now_ms=0) is CLAIMED
    assert "redis://" in repr(store) and prefix in repr(store)
    store.close()
    assert redis_client.ping()
    redis_client.delete(prefix + "k")


def test_redis_password_is_never_shown(redis_client):
    redis = servers.client_module("redis", "redis")
    from delayq.stores.redis import RedisStore

    user = f"delayq-test-{uuid.uuid4().hex[:8]}"
    try:
        redis_client.acl_setuser(
            user, enabled=True, passwords=["+s3cret-pw"], keys=["*"], commands=["+@all"]
        )
    except redis.ResponseError as exc:
        if _in_ci():
            raise
        pytest.skip(f"cannot create an ACL user on this server (Redis < 6?): {exc}")
    try:
        kwargs = redis_client.connection_pool.connection_kwargs
        where = f"{kwargs['host']}:{kwargs['port']}/0"
        store = RedisStore(f"redis://{user}:s3cret-pw@{where}")
        assert store.claim("pw-k", lease_ms=1_000, now_ms=0) is CLAIMED
        assert "s3cret-pw" not in repr(store) and "***" in repr(store)
        store.release("pw-k")
        store.close()
        with pytest.raises(redis.AuthenticationError) as caught:
            RedisStore(f"redis://{user}:wrong-pw@{where}")
        assert "wrong-pw" not in str(caught.value) and "***" in str(caught.value)
    finally:
        redis_client.acl_deluser(user)


# --- PostgreSQL: tables, reconnection, DSN redaction ---------------------------------------------


def test_postgres_table_is_created_with_the_documented_columns(postgres_store, postgres_dsn):
    psycopg = servers.client_module("psycopg", "postgres")
    store = postgres_store()
    with psycopg.connect(postgres_dsn) as conn:
        rows = conn.execute(
            "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
            "WHERE table_name = %s ORDER BY ordinal_position",
            (store.table,),
        ).fetchall()
    assert rows == [
        ("key", "text", "NO"),
        ("done_at", "bigint", "YES"),
        ("lease_until", "bigint", "NO"),
        ("generation", "bigint", "NO"),
        ("marked_at", "bigint", "YES"),
    ]
    again = postgres_store(table=store.table)  # an existing table is used as it is
    assert again.claim("k", lease_ms=1_000, now_ms=0) is CLAIMED
    assert store.claim("k", lease_ms=1_000, now_ms=0) is BUSY


def test_postgres_schema_qualified_table(postgres_store, postgres_dsn):
    psycopg = servers.client_module("psycopg", "postgres")
    schema = f"delayq_test_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        store = postgres_store(table=f"{schema}.idem")
        assert store.claim("k", lease_ms=1_000, now_ms=0) is CLAIMED
        store.complete("k", now_ms=1)
        assert store.claim("k", lease_ms=1_000, now_ms=2) is DONE
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.mark.parametrize("table", ["x; DROP TABLE y", "a.b.c", "", "1abc", "bad-name", "a" * 64])
def test_postgres_rejects_unsafe_table_names(postgres_store, table):
    with pytest.raises(ValueError, match="identifier"):
        postgres_store(table=table)


def test_postgres_reconnects_after_the_connection_is_killed(postgres_store, postgres_dsn):
    psycopg = servers.client_module("psycopg", "postgres")
    app = f"delayq-test-{uuid.uuid4().hex[:8]}"
    dsn = psycopg.conninfo.make_conninfo(postgres_dsn, application_name=app)
    store = postgres_store(dsn=dsn)
    assert store.claim("k", lease_ms=60_000, now_ms=0) is CLAIMED
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        killed = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = %s",
            (app,),
        ).fetchone()[0]
    assert killed == 1
    with pytest.raises(psycopg.OperationalError):
        store.claim("k", lease_ms=60_000, now_ms=1)
    assert store.claim("k", lease_ms=60_000, now_ms=1) is BUSY  # a fresh connection
    store.complete("k", now_ms=2)
    assert store.claim("k", lease_ms=60_000, now_ms=3) is DONE


def test_postgres_closed_store_refuses_work(postgres_store):
    store = postgres_store()
    store.close()
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.claim("k", lease_ms=1_000, now_ms=0)


@pytest.mark.parametrize(
    "template",
    [
        "postgresql://postgres:s3cret-pw@127.0.0.1:{port}/postgres",
        "postgresql://postgres@127.0.0.1:{port}/postgres?password=s3cret-pw",
        "host=127.0.0.1 port={port} user=postgres password=s3cret-pw",
        "host=127.0.0.1 port={port} user=postgres password='s3cret-pw' junk",
        "postgresql://postgres:s3cret-pw@127.0.0.1:not-a-port/postgres",
    ],
)
def test_postgres_password_is_never_shown_in_errors(template):
    psycopg = servers.client_module("psycopg", "postgres")
    from delayq.stores.postgres import PostgresStore, redact_dsn

    dsn = template.format(port=free_port())  # nothing listens there
    with pytest.raises(psycopg.Error) as caught:
        PostgresStore(dsn, connect_timeout_s=2)
    assert "s3cret-pw" not in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    assert "***" in str(caught.value)
    assert "s3cret-pw" not in redact_dsn(dsn) and "***" in redact_dsn(dsn)


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        ("postgresql://app:pw@db:5432/app", "postgresql://app:***@db:5432/app"),
        (
            "postgresql://app@db/app?password=pw&sslmode=require",
            "postgresql://app@db/app?password=***&sslmode=require",
        ),
        ("host=db user=app password='p w' dbname=app", "host=db user=app password=*** dbname=app"),
        ("host=db sslpassword=pw", "host=db sslpassword=***"),
        ("postgresql://app@db/app", "postgresql://app@db/app"),
    ],
)
def test_redact_dsn(dsn, expected):
    module = servers.client_module("delayq.stores.postgres", "postgres")
    assert module.redact_dsn(dsn) == expected


def test_postgres_repr_shows_no_password(postgres_store, postgres_dsn):
    psycopg = servers.client_module("psycopg", "postgres")
    store = postgres_store()
    password = psycopg.conninfo.conninfo_to_dict(postgres_dsn).get("password")
    assert store.table in repr(store)
    if password:
        assert password not in repr(store)


# --- the harness: local servers and the fixtures' CI rule ----------------------------------------


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text()


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def test_local_redis_starts_and_stops_only_its_own_process():
    from delayq.local.servers import LocalRedis

    server = LocalRedis().start()
    pid = server.pid
    assert pid is not None and _alive(pid)
    server.cleanup()
    assert not _alive(pid)
    assert not server.base_dir.exists()


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_local_postgres_runs_as_the_postgres_user_and_stops_with_its_children():
    psycopg = servers.client_module("psycopg", "postgres")
    from delayq.local.servers import LocalPostgres, LocalServerError

    try:
        server = LocalPostgres().start()
    except LocalServerError as exc:
        if _in_ci():
            raise
        pytest.skip(str(exc))
    try:
        pid = server.pid
        assert pid is not None
        children = _children(pid)
        assert children, "postgres forks its background processes"
        if os.geteuid() == 0:
            uid_line = next(
                line
                for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                if line.startswith("Uid:")
            )
            import pwd

            assert int(uid_line.split()[1]) == pwd.getpwnam("postgres").pw_uid
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (n int)")
        server.stop()
        assert not _alive(pid) and not any(_alive(child) for child in children)
        server.start()  # data kept across a restart
        with psycopg.connect(server.dsn) as conn:
            assert conn.execute("SELECT count(*) FROM kept").fetchone() == (0,)
    finally:
        server.cleanup()
    assert not server.base_dir.exists()


def test_missing_servers_say_what_to_install(monkeypatch, tmp_path):
    from delayq.local.servers import LocalPostgres, LocalRedis, LocalServerError

    monkeypatch.setenv("DELAYQ_REDIS_SERVER", str(tmp_path / "no-redis-here"))
    monkeypatch.setenv("DELAYQ_POSTGRES_BIN", str(tmp_path / "no-postgres-here"))
    with pytest.raises(LocalServerError, match="apt-get install redis-server"):
        LocalRedis()
    with pytest.raises(LocalServerError, match="apt-get install postgresql"):
        LocalPostgres()


NEEDS_SERVERS = """
def test_needs_redis(redis_url):
    assert redis_url

def test_needs_postgres(postgres_dsn):
    assert postgres_dsn
"""


def _run_pytest_without_servers(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_needs_servers.py").write_text(NEEDS_SERVERS)
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "POSTGRES_DSN", "CI")}
    env["DELAYQ_REDIS_SERVER"] = str(tmp_path / "no-redis-here")
    env["DELAYQ_POSTGRES_BIN"] = str(tmp_path / "no-postgres-here")
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )


def test_no_servers_in_ci_is_a_failure_not_a_skip(tmp_path):
    run = _run_pytest_without_servers(tmp_path, ci="true")
    assert run.returncode != 0, run.stdout
    assert "no Redis server" in run.stdout and "no PostgreSQL server" in run.stdout
    assert "2 errors" in run.stdout, run.stdout


def test_no_servers_outside_ci_skips_and_says_what_to_install(tmp_path):
    run = _run_pytest_without_servers(tmp_path, ci=None)
    assert run.returncode == 0, run.stdout
    assert "2 skipped" in run.stdout, run.stdout
    assert "apt-get install redis-server" in run.stdout
    assert "apt-get install postgresql" in run.stdout


@pytest.mark.parametrize(("module", "extra"), [("redis", "redis"), ("postgres", "postgres")])
def test_store_modules_say_which_extra_to_install(module, extra):
    blocked = "redis" if module == "redis" else "psycopg"
    code = f"import sys; sys.modules[{blocked!r}] = None; import delayq.stores.{module}"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode != 0
    assert "ImportError" in run.stderr
    assert f"pip install 'delayq[{extra}]'" in run.stderr
