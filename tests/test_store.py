"""Tests of collectives.rendezvous.store: the rank-0 key-value store."""

import socket
import struct
import threading
import time

import pytest

from collectives.rendezvous.store import StoreClient, StoreServer, barrier

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def server():
    srv = StoreServer("127.0.0.1")
    yield srv
    srv.close()


@pytest.fixture
def client(server):
    c = StoreClient("127.0.0.1", server.port, timeout=10)
    yield c
    c.close()


def _ipv6_loopback_works() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_set_get(client):
    client.set("a", b"hello")
    assert client.get("a") == b"hello"
    client.set("a", b"")
    assert client.get("a") == b""


def test_binary_and_large_values(client):
    value = bytes(range(256)) * 40000  # 10 MB, every byte value
    client.set("big", value)
    assert client.get("big") == value
    client.set("ключ/☃", b"\x00\xff")
    assert client.get("ключ/☃") == b"\x00\xff"


def test_add(client):
    assert client.add("n", 1) == 1
    assert client.add("n", 5) == 6
    assert client.add("n", -10) == -4
    assert client.get("n") == b"-4"


def test_add_is_atomic_across_clients(server):
    def work():
        with StoreClient("127.0.0.1", server.port, timeout=10) as c:
            for _ in range(100):
                c.add("counter", 1)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with StoreClient("127.0.0.1", server.port) as c:
        assert c.get("counter") == b"800"


def test_check_and_delete(client):
    assert client.check([]) is True
    assert client.check(["x"]) is False
    client.set("x", b"1")
    client.set("y", b"2")
    assert client.check(["x", "y"]) is True
    assert client.check("x") is True
    assert client.check(["x", "z"]) is False
    assert client.delete("x") is True
    assert client.delete("x") is False
    assert client.check(["x"]) is False


def test_get_blocks_until_another_client_sets(server, client):
    results = []

    def waiter():
        with StoreClient("127.0.0.1", server.port, timeout=10) as c:
            results.append((c.get("late", timeout=10), time.monotonic()))

    threads = [threading.Thread(target=waiter) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    assert results == []
    set_at = time.monotonic()
    client.set("late", b"value")
    for t in threads:
        t.join(5)
    assert [r[0] for r in results] == [b"value"] * 3
    assert all(at >= set_at for _, at in results)


def test_get_woken_by_add(server, client):
    out = []
    t = threading.Thread(target=lambda: out.append(client.get("cnt", timeout=10)))
    t.start()
    time.sleep(0.1)
    with StoreClient("127.0.0.1", server.port) as other:
        other.add("cnt", 7)
    t.join(5)
    assert out == [b"7"]


def test_get_timeout(server, client):
    start = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        client.get("never", timeout=0.5)
    elapsed = time.monotonic() - start
    assert 0.45 <= elapsed < 2.0
    assert "never" in str(info.value) and str(server.port) in str(info.value)
    # The connection is still usable after a server-side timeout.
    client.set("k", b"v")
    assert client.get("k", timeout=0) == b"v"
    with pytest.raises(TimeoutError):
        client.get("never", timeout=0)


def test_client_started_before_server():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    holder = {}

    def connect():
        holder["client"] = StoreClient("127.0.0.1", port, timeout=10)

    t = threading.Thread(target=connect)
    t.start()
    time.sleep(0.4)  # the client is now retrying on ECONNREFUSED
    assert "client" not in holder
    srv = StoreServer("127.0.0.1", port)
    try:
        t.join(5)
        c = holder["client"]
        c.set("a", b"b")
        assert c.get("a") == b"b"
        c.close()
    finally:
        srv.close()


def test_connect_timeout_names_address():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=f"127.0.0.1:{port}"):
        StoreClient("127.0.0.1", port, timeout=0.3)
    assert time.monotonic() - start < 2.0


@pytest.mark.parametrize("garbage", [
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"\x00" * 100,
    b"CS\x01\x63\x00\x00\x00\x00",  # unknown op
    b"CS\x01\x01\x00\x00\x00\x01",  # SET with one field (truncated, then closed)
    b"CS\x01\x02\x00\x00\x00\x01\x00\x00\x00\x01k",  # GET without its wait field
    b"CS\x01\x01\x00\x00\x00\x02\xff\xff\xff\xff",  # field length over the limit
    b"CS\x09\x01\x00\x00\x00\x00",  # bad version
])
def test_garbage_does_not_break_the_server(server, client, garbage):
    client.set("before", b"1")
    with socket.create_connection(("127.0.0.1", server.port)) as bad:
        try:
            bad.sendall(garbage)
            bad.shutdown(socket.SHUT_WR)
        except OSError:  # the server may reset it before we finish writing
            pass
        bad.settimeout(5)
        got = b""
        while True:  # at most a hello and an answer, then it drops the connection
            try:
                chunk = bad.recv(100)
            except ConnectionResetError:  # closed with our bytes unread
                break
            if not chunk:
                break
            got += chunk
        assert len(got) <= 19 + 33, got
    with StoreClient("127.0.0.1", server.port, timeout=5) as fresh:
        assert fresh.get("before") == b"1"
    assert client.add("still", 1) == 1


def test_add_on_non_counter_drops_only_that_client(server, client):
    client.set("text", b"abc")
    with StoreClient("127.0.0.1", server.port, timeout=5) as other:
        with pytest.raises(ConnectionError):
            other.add("text", 1)
    assert client.get("text") == b"abc"


def test_lost_server_raises_connection_error():
    srv = StoreServer("127.0.0.1")
    c = StoreClient("127.0.0.1", srv.port, timeout=5)
    c.set("k", b"v")
    srv.close()
    with pytest.raises(ConnectionError, match=f"127.0.0.1:{srv.port}"):
        c.get("k")
    with pytest.raises(ConnectionError):
        c.set("k", b"v")
    c.close()


def test_server_close_wakes_a_blocked_get():
    srv = StoreServer("127.0.0.1")
    c = StoreClient("127.0.0.1", srv.port, timeout=30)
    errors = []

    def blocked():
        try:
            c.get("never")
        except ConnectionError as exc:
            errors.append(exc)

    t = threading.Thread(target=blocked)
    t.start()
    time.sleep(0.2)
    srv.close()
    t.join(5)
    assert not t.is_alive() and len(errors) == 1
    c.close()


def test_local_address(client):
    assert client.local_address() == "127.0.0.1"


@pytest.mark.skipif(not _ipv6_loopback_works(), reason="no IPv6 loopback")
def test_ipv6():
    with StoreServer("::1") as srv:
        assert srv.address == f"[::1]:{srv.port}"
        with StoreClient("::1", srv.port, timeout=5) as c:
            c.set("six", b"6")
            assert c.get("six") == b"6"
            assert c.local_address() == "::1"


def test_port_in_use_raises():
    with StoreServer("127.0.0.1") as srv:
        with pytest.raises(OSError, match="store cannot listen"):
            StoreServer("127.0.0.1", srv.port)


def test_close_is_idempotent_and_leaves_no_thread():
    before = set(threading.enumerate())
    srv = StoreServer("127.0.0.1")
    clients = [StoreClient("127.0.0.1", srv.port) for _ in range(3)]
    clients[0].set("a", b"b")
    srv.close()
    srv.close()
    for c in clients:
        c.close()
        c.close()
    assert set(threading.enumerate()) <= before
    assert srv._listener.fileno() == -1


def test_many_clients_one_thread():
    with StoreServer("127.0.0.1") as srv:
        base = threading.active_count()
        clients = [StoreClient("127.0.0.1", srv.port) for _ in range(50)]
        assert threading.active_count() == base
        for i, c in enumerate(clients):
            c.set(f"k{i}", struct.pack(">I", i))
        assert clients[0].get("k49") == struct.pack(">I", 49)
        for c in clients:
            c.close()


def test_barrier(server):
    size = 4
    done = []

    def rank(r):
        with StoreClient("127.0.0.1", server.port, timeout=10) as c:
            time.sleep(0.05 * r)
            for _ in range(3):  # reusable under one name
                barrier(c, "start", size, timeout=10)
            done.append((r, time.monotonic()))

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(size)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(r for r, _ in done) == list(range(size))
    assert all(at - start >= 0.15 for _, at in done)  # nobody left before rank 3 came


def test_barrier_timeout_names_count(client):
    with pytest.raises(TimeoutError, match=r"barrier 'b'.*1 of 3"):
        barrier(client, "b", 3, timeout=0.3)
