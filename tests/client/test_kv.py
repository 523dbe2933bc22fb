"""Key-value calls against the fake cluster: results, paging, comparisons, counters."""

from __future__ import annotations

import pytest

from rallypoint.client import Client, KeyValue

from .fake_server import FakeCluster, fake_cluster


async def test_put_then_get_returns_the_stored_key(client: Client) -> None:
    put = await client.put("job/a", b"1")
    got = await client.get("job/a")
    assert got == put.kv
    assert isinstance(got, KeyValue)
    assert (got.key, got.value, got.version) == (b"job/a", b"1", 1)
    assert got.create_revision == got.mod_revision == put.header.revision
    second = await client.put("job/a", "2", prev_kv=True)
    assert second.prev_kv == got
    assert second.kv.version == 2
    assert second.kv.create_revision == got.create_revision
    assert second.kv.mod_revision > got.mod_revision


async def test_get_of_a_missing_key_is_none(client: Client) -> None:
    assert await client.get("nope") is None
    assert await client.get("nope", serializable=True) is None


async def test_results_are_frozen(client: Client) -> None:
    put = await client.put("k", b"v")
    with pytest.raises(AttributeError):
        put.kv.value = b"x"  # type: ignore[misc]


async def test_range_pages_through_a_prefix_in_key_order(client: Client) -> None:
    for i in range(7):
        await client.put(f"p/{i}", str(i))
    await client.put("q/0", b"other")
    first = await client.range("p/", limit=3)
    assert [kv.key for kv in first.kvs] == [b"p/0", b"p/1", b"p/2"]
    assert first.more
    everything = [kv.key async for kv in client.range_pages("p/", page_size=3)]
    assert everything == [f"p/{i}".encode() for i in range(7)]
    keys_only = await client.range("p/", keys_only=True)
    assert {kv.value for kv in keys_only.kvs} == {b""}


async def test_delete_a_key_or_a_prefix(client: Client) -> None:
    for key in ("d/1", "d/2", "d/3", "e/1"):
        await client.put(key, b"x")
    one = await client.delete("d/1", prev_kv=True)
    assert one.deleted == 1
    assert [kv.key for kv in one.prev_kvs] == [b"d/1"]
    rest = await client.delete("d/", prefix=True)
    assert rest.deleted == 2
    assert (await client.range("d/")).kvs == ()
    assert await client.get("e/1") is not None
    nothing = await client.delete("d/1")
    assert nothing.deleted == 0


async def test_compare_and_set_each_comparison(client: Client) -> None:
    created = await client.compare_and_set("c", b"1", must_not_exist=True)
    assert created.succeeded and created.kv is not None
    again = await client.compare_and_set("c", b"9", must_not_exist=True)
    assert not again.succeeded
    assert again.kv == created.kv
    by_value = await client.compare_and_set("c", b"2", value_equals=b"1")
    assert by_value.succeeded
    assert by_value.kv is not None
    stale = await client.compare_and_set("c", b"3", mod_revision_equals=created.kv.mod_revision)
    assert not stale.succeeded
    fresh = await client.compare_and_set("c", b"3", mod_revision_equals=by_value.kv.mod_revision)
    assert fresh.succeeded
    assert (await client.get("c")) == fresh.kv


async def test_compare_and_set_needs_exactly_one_comparison(client: Client) -> None:
    with pytest.raises(ValueError, match="exactly one"):
        await client.compare_and_set("c", b"1")
    with pytest.raises(ValueError, match="exactly one"):
        await client.compare_and_set("c", b"1", must_not_exist=True, value_equals=b"0")


async def test_add_counts_from_zero(client: Client, cluster: FakeCluster) -> None:
    assert (await client.add("n", 5)).value == 5
    assert (await client.add("n", -2)).value == 3
    assert (await client.get("n")) is not None
    assert cluster.store.applies["Add"] == 2


async def test_an_answer_larger_than_grpcs_default_4_mib_is_received() -> None:
    """A round of 100,000 members answers Configure or Evict with ~4.4 MB of RoundInfo:
    the client accepts answers up to the server's own cap (64 MiB), not gRPC's 4 MiB."""
    async with fake_cluster(1, max_value_bytes=3 * 1024 * 1024) as cluster:
        client = Client(cluster.addresses, timeout_s=20)
        try:
            big = b"x" * (3 * 1024 * 1024)
            await client.put("big/1", big)
            await client.put("big/2", big)
            page = await client.range("big/")
            assert [kv.value for kv in page.kvs] == [big, big]
        finally:
            await client.close()
