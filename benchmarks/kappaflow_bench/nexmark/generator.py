"""The Nexmark model's generator: people, auctions and bids, as nexmark/nexmark makes them.

A port of the Flink Nexmark generator's model (``NexmarkGenerator``, ``PersonGenerator``,
``AuctionGenerator``, ``BidGenerator``, ``PriceGenerator``, ``StringsGenerator``) with
its default configuration:

- event ``n`` is a person if ``n % 50 == 0``, an auction if ``n % 50`` is 1 to 3, a bid
  otherwise: 1:3:46;
- ids are consecutive from 1000 per kind; a bid's auction is a *hot* one (the first of
  the last 100 auctions) unless ``randrange(2) == 0``, otherwise one of the 100 auctions
  in flight plus 10 ids ahead; its bidder is a hot one (the second of the last 100
  people) unless ``randrange(4) == 0``, otherwise one of the 1,000 active people plus 10
  ahead; an auction's seller likewise (the first of the last 100 people, hot ratio 4);
- categories 10 to 14; prices ``round(10 ** (6 * u) * 100)``; half the bids on one of
  four hot channels; ``extra`` pads each record to about 200 (person), 500 (auction)
  and 100 (bid) bytes of content;
- event time: ``base_time + n / rate`` (10,000 events/s of event time by default, the
  suite's ``first-event.rate``), in order (``outOfOrderGroupSize`` 1).

What differs: Python's ``random.Random(seed)`` instead of Java's ``Random``, so the
values are not those of the Java generator but the same run of a seed gives the same
bytes; the URL of a non-hot channel comes from a generator seeded by the channel (the
Java one caches a random one per process); and a bidder's id is offset by 1000 once
(the Java ``BidGenerator`` adds ``FIRST_PERSON_ID`` twice, which puts every bidder 1000
ids past the people).

Records are JSON objects on one topic per kind (``person``, ``auction``, ``bid``),
with the model's fields at the top level and ``dateTime`` (and ``expires``) in epoch
milliseconds: a job API source takes its event time from a top-level field present in
every record, which one topic of all three kinds (``event_type`` with nested objects,
as nexmark's ``insert_kafka``) does not have.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Producer

from kappaflow.errors import ProduceError
from kappaflow.kafka.records import produce_with_retry

PERSON_PROPORTION = 1
AUCTION_PROPORTION = 3
BID_PROPORTION = 46
TOTAL_PROPORTION = PERSON_PROPORTION + AUCTION_PROPORTION + BID_PROPORTION
FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
#: NexmarkConfiguration's defaults.
NUM_IN_FLIGHT_AUCTIONS = 100
NUM_ACTIVE_PEOPLE = 1000
HOT_AUCTION_RATIO = 2
HOT_BIDDERS_RATIO = 4
HOT_SELLERS_RATIO = 4
AVG_PERSON_BYTES = 200
AVG_AUCTION_BYTES = 500
AVG_BID_BYTES = 100
#: Event time advances by 1/rate per event (the suite's first-event.rate).
EVENT_RATE = 10_000
#: The generator classes' constants: hot ids are the first of each batch of 100.
HOT_BATCH = 100
ID_LEAD = 10
HOT_CHANNELS = ("Google", "Facebook", "Baidu", "Apple")
CHANNELS = 10_000
US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = (
    "Phoenix",
    "Los Angeles",
    "San Francisco",
    "Boise",
    "Portland",
    "Bend",
    "Redmond",
    "Seattle",
    "Kent",
    "Cheyenne",
)
FIRST_NAMES: tuple[str, ...] = (
    "Peter",
    "Paul",
    "Luke",
    "John",
    "Saul",
    "Vicky",
    "Kate",
    "Julie",
    "Sarah",
    "Deiter",
    "Walter",
)
LAST_NAMES: tuple[str, ...] = (
    "Shultz",
    "Abrams",
    "Spencer",
    "White",
    "Bartels",
    "Walton",
    "Smith",
    "Jones",
    "Noris",
)
KINDS = ("person", "auction", "bid")


def kind_of(event_id: int) -> str:
    rem = event_id % TOTAL_PROPORTION
    if rem < PERSON_PROPORTION:
        return "person"
    if rem < PERSON_PROPORTION + AUCTION_PROPORTION:
        return "auction"
    return "bid"


def last_base0_person_id(event_id: int) -> int:
    epoch, offset = divmod(event_id, TOTAL_PROPORTION)
    if offset >= PERSON_PROPORTION:
        offset = PERSON_PROPORTION - 1
    return epoch * PERSON_PROPORTION + offset


def last_base0_auction_id(event_id: int) -> int:
    epoch, offset = divmod(event_id, TOTAL_PROPORTION)
    if offset < PERSON_PROPORTION:
        epoch -= 1
        offset = AUCTION_PROPORTION - 1
    elif offset >= PERSON_PROPORTION + AUCTION_PROPORTION:
        offset = AUCTION_PROPORTION - 1
    else:
        offset -= PERSON_PROPORTION
    return epoch * AUCTION_PROPORTION + offset


def next_base0_person_id(event_id: int, rng: random.Random) -> int:
    people = last_base0_person_id(event_id) + 1
    active = min(people, NUM_ACTIVE_PEOPLE)
    return people - active + rng.randrange(active + ID_LEAD)


def next_base0_auction_id(event_id: int, rng: random.Random) -> int:
    last = last_base0_auction_id(event_id)
    low = max(last - NUM_IN_FLIGHT_AUCTIONS, 0)
    return low + rng.randrange(last - low + 1 + ID_LEAD)


def next_price(rng: random.Random) -> int:
    return round(float(10.0 ** (rng.random() * 6.0)) * 100.0)


def next_string(rng: random.Random, max_length: int, space: str = " ") -> str:
    """Up to ``max_length`` letters, about one in 13 a ``space`` (trimmed at the ends)."""
    length = 3 + rng.randrange(max_length - 3)
    letters = string.ascii_lowercase
    chars = [space if rng.randrange(13) == 0 else rng.choice(letters) for _ in range(length)]
    return "".join(chars).strip()


def next_extra(rng: random.Random, current_size: int, average: int) -> str:
    """Letters such that ``current_size`` plus their length is ``average`` on average."""
    if current_size > average:
        return ""
    wanted = average - current_size
    delta = round(wanted * 0.2)
    size = wanted - delta + (rng.randrange(2 * delta) if delta else 0)
    return "".join(rng.choices(string.ascii_lowercase, k=size))


def _base_url(rng: random.Random) -> str:
    parts = [next_string(rng, 5, "_") for _ in range(3)]
    return "https://www.nexmark.com/" + "/".join(parts) + "/item.htm?query=1"


@dataclass
class Generator:
    """Events ``0, 1, 2, ...`` of one seeded run, event time from ``base_time_ms``."""

    seed: int
    base_time_ms: int
    rate: int = EVENT_RATE
    _rng: random.Random = field(init=False, repr=False)
    _hot_urls: tuple[str, ...] = field(init=False, repr=False)
    _urls: dict[int, str] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        urls = random.Random(f"{self.seed}/hot")
        self._hot_urls = tuple(_base_url(urls) for _ in HOT_CHANNELS)

    def time_of(self, event_id: int) -> int:
        return self.base_time_ms + event_id * 1000 // self.rate

    def events(self, count: int, first: int = 0) -> Iterator[tuple[str, dict[str, Any]]]:
        """``(kind, record)`` of events ``first`` to ``first + count - 1``."""
        for event_id in range(first, first + count):
            kind = kind_of(event_id)
            if kind == "person":
                yield kind, self.person(event_id)
            elif kind == "auction":
                yield kind, self.auction(event_id)
            else:
                yield kind, self.bid(event_id)

    def person(self, event_id: int) -> dict[str, Any]:
        rng = self._rng
        name = f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"
        email = f"{next_string(rng, 7)}@{next_string(rng, 5)}.com"
        card = " ".join(f"{rng.randrange(10_000):04d}" for _ in range(4))
        city, state = rng.choice(US_CITIES), rng.choice(US_STATES)
        size = 8 + len(name) + len(email) + len(card) + len(city) + len(state)
        return {
            "id": last_base0_person_id(event_id) + FIRST_PERSON_ID,
            "name": name,
            "emailAddress": email,
            "creditCard": card,
            "city": city,
            "state": state,
            "dateTime": self.time_of(event_id),
            "extra": next_extra(rng, size, AVG_PERSON_BYTES),
        }

    def auction(self, event_id: int) -> dict[str, Any]:
        rng = self._rng
        if rng.randrange(HOT_SELLERS_RATIO) > 0:
            seller = last_base0_person_id(event_id) // HOT_BATCH * HOT_BATCH
        else:
            seller = next_base0_person_id(event_id, rng)
        category = FIRST_CATEGORY_ID + rng.randrange(NUM_CATEGORIES)
        initial = next_price(rng)
        now = self.time_of(event_id)
        # An auction lasts on average until the auction NUM_IN_FLIGHT_AUCTIONS ahead.
        ahead = NUM_IN_FLIGHT_AUCTIONS * TOTAL_PROPORTION // AUCTION_PROPORTION
        horizon = self.time_of(event_id + ahead) - now
        expires = now + 1 + rng.randrange(max(horizon * 2, 1))
        name, description = next_string(rng, 20), next_string(rng, 100)
        reserve = initial + next_price(rng)
        size = 8 + len(name) + len(description) + 8 * 5
        return {
            "id": last_base0_auction_id(event_id) + FIRST_AUCTION_ID,
            "itemName": name,
            "description": description,
            "initialBid": initial,
            "reserve": reserve,
            "dateTime": now,
            "expires": expires,
            "seller": seller + FIRST_PERSON_ID,
            "category": category,
            "extra": next_extra(rng, size, AVG_AUCTION_BYTES),
        }

    def bid(self, event_id: int) -> dict[str, Any]:
        rng = self._rng
        if rng.randrange(HOT_AUCTION_RATIO) > 0:
            auction = last_base0_auction_id(event_id) // HOT_BATCH * HOT_BATCH
        else:
            auction = next_base0_auction_id(event_id, rng)
        if rng.randrange(HOT_BIDDERS_RATIO) > 0:
            bidder = last_base0_person_id(event_id) // HOT_BATCH * HOT_BATCH + 1
        else:
            bidder = next_base0_person_id(event_id, rng)
        price = next_price(rng)
        if rng.randrange(2) > 0:
            hot = rng.randrange(len(HOT_CHANNELS))
            channel, url = HOT_CHANNELS[hot], self._hot_urls[hot]
        else:
            number = rng.randrange(CHANNELS)
            channel, url = f"channel-{number}", self._channel_url(number)
        return {
            "auction": auction + FIRST_AUCTION_ID,
            "bidder": bidder + FIRST_PERSON_ID,
            "price": price,
            "channel": channel,
            "url": url,
            "dateTime": self.time_of(event_id),
            "extra": next_extra(rng, 32, AVG_BID_BYTES),
        }

    def _channel_url(self, number: int) -> str:
        url = self._urls.get(number)
        if url is None:
            rng = random.Random(f"{self.seed}/channel/{number}")
            url = _base_url(rng)
            if rng.randrange(10) > 0:
                # Java's abs(Integer.reverse(n)): the bits of n reversed in 32 bits.
                reversed_bits = int(f"{number:032b}"[::-1], 2)
                if reversed_bits >= 2**31:
                    reversed_bits = 2**32 - reversed_bits
                url += f"&channel_id={reversed_bits}"
            self._urls[number] = url
        return url


@dataclass
class Produced:
    """What ``produce`` wrote: events per kind, the first and last event time."""

    events: dict[str, int]
    first_time_ms: int
    last_time_ms: int
    seconds: float


def produce(
    client_config: dict[str, Any],
    topics: dict[str, str],
    *,
    events: int,
    seed: int,
    base_time_ms: int,
) -> Produced:
    """``events`` events of the seeded run, each kind to its topic in ``topics``."""
    import time

    began = time.monotonic()
    writer = Producer(
        {
            **client_config,
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    counts = dict.fromkeys(KINDS, 0)
    generator = Generator(seed, base_time_ms)
    for n, (kind, record) in enumerate(generator.events(events)):
        produce_with_retry(writer, topics[kind], json.dumps(record).encode(), poll_s=0.01)
        counts[kind] += 1
        if n % 10_000 == 0:
            writer.poll(0)
    left = writer.flush(120)
    if left:
        raise ProduceError(f"{left} Nexmark events were not delivered")
    return Produced(
        counts,
        generator.time_of(0),
        generator.time_of(events - 1),
        round(time.monotonic() - began, 1),
    )
