"""The Nexmark generator: its proportions, ids, hot ratios and determinism."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kappaflow_bench.cli import main
from kappaflow_bench.nexmark.generator import (
    AVG_BID_BYTES,
    FIRST_AUCTION_ID,
    FIRST_PERSON_ID,
    HOT_CHANNELS,
    US_STATES,
    Generator,
    kind_of,
)

BASE = 1_795_000_000_000


def run(seed: int, count: int, base: int = BASE) -> list[tuple[str, dict[str, Any]]]:
    return list(Generator(seed, base).events(count))


def test_people_auctions_and_bids_come_one_three_and_forty_six_in_fifty() -> None:
    events = run(1, 5_000)
    assert Counter(kind for kind, _ in events) == {"person": 100, "auction": 300, "bid": 4_600}
    # In every block of 50: a person first, three auctions, then the bids.
    assert [kind for kind, _ in events[:5]] == ["person", "auction", "auction", "auction", "bid"]
    assert [kind_of(n) for n in range(50, 54)] == ["person", "auction", "auction", "auction"]


def test_a_seed_gives_the_same_events_and_another_seed_others() -> None:
    first = [json.dumps(r) for _, r in run(7, 2_000)]
    assert first == [json.dumps(r) for _, r in run(7, 2_000)]
    other = [json.dumps(r) for _, r in run(8, 2_000)]
    assert sum(a != b for a, b in zip(first, other, strict=True)) > 1_900
    # Event times come from the base time, not the clock.
    assert [r["dateTime"] for _, r in run(7, 3, base=0)] == [0, 0, 0]


def test_ids_fields_and_event_times() -> None:
    events = run(3, 10_000)
    people = [r for kind, r in events if kind == "person"]
    auctions = [r for kind, r in events if kind == "auction"]
    bids = [r for kind, r in events if kind == "bid"]
    assert [p["id"] for p in people] == list(range(FIRST_PERSON_ID, FIRST_PERSON_ID + 200))
    assert [a["id"] for a in auctions] == list(range(FIRST_AUCTION_ID, FIRST_AUCTION_ID + 600))
    assert set(people[0]) == {
        "id",
        "name",
        "emailAddress",
        "creditCard",
        "city",
        "state",
        "dateTime",
        "extra",
    }
    assert set(auctions[0]) == {
        "id",
        "itemName",
        "description",
        "initialBid",
        "reserve",
        "dateTime",
        "expires",
        "seller",
        "category",
        "extra",
    }
    assert set(bids[0]) == {"auction", "bidder", "price", "channel", "url", "dateTime", "extra"}
    assert {p["state"] for p in people} == set(US_STATES)
    assert {a["category"] for a in auctions} == {10, 11, 12, 13, 14}
    assert all(
        a["reserve"] > a["initialBid"] > 0 and a["expires"] > a["dateTime"] for a in auctions
    )
    # Event time: 10,000 events a second from the base, in order.
    times = [r["dateTime"] for _, r in events]
    assert times[0] == BASE and times[-1] == BASE + 999 and times == sorted(times)
    # A bid names an auction and a bidder that exist, or are at most 10 ids ahead.
    for n, (kind, record) in enumerate(events):
        if kind == "bid":
            made = n // 50 * 3 + 3  # auctions made so far, in this block's three included
            assert FIRST_AUCTION_ID <= record["auction"] < FIRST_AUCTION_ID + made + 10
    sizes = [len(b["extra"]) + 32 for b in bids]
    assert abs(sum(sizes) / len(sizes) - AVG_BID_BYTES) < 3


def test_hot_auctions_bidders_sellers_and_channels() -> None:
    events = run(11, 50_000)
    bids = [r for kind, r in events if kind == "bid"]
    auctions = [r for kind, r in events if kind == "auction"]
    # A hot auction is the first of a batch of 100, chosen for half the bids (ratio 2);
    # the rest pick among the last 100 auctions, where 1 in 100 is such a first one too.
    hot = sum(1 for b in bids if (b["auction"] - FIRST_AUCTION_ID) % 100 == 0)
    assert 0.49 < hot / len(bids) < 0.53
    # Hot bidders: the second person of a batch of 100, for 3 bids in 4 (ratio 4).
    hot_bidders = sum(1 for b in bids if (b["bidder"] - FIRST_PERSON_ID) % 100 == 1)
    assert 0.73 < hot_bidders / len(bids) < 0.77
    hot_sellers = sum(1 for a in auctions if (a["seller"] - FIRST_PERSON_ID) % 100 == 0)
    assert 0.72 < hot_sellers / len(auctions) < 0.78
    channels = Counter(b["channel"] for b in bids)
    assert 0.48 < sum(channels[c] for c in HOT_CHANNELS) / len(bids) < 0.52
    # A channel always has the same URL.
    urls: dict[str, set[str]] = {}
    for b in bids:
        urls.setdefault(b["channel"], set()).add(b["url"])
    assert all(len(found) == 1 for found in urls.values())


def test_nexmark_misuse_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    assert main(["nexmark", "--queries", "q0,q4", "--out", out]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kappaflow-bench: error[KF001]: "), err
    assert "q4" in err[0]
    assert main(["nexmark", "--engines", "spark", "--out", out]) == 2
    assert "--engines" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
