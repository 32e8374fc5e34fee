"""The YSB workload: its constants and the exact bytes of an event.

An event is the original's JSON text, a space after every ``:`` and ``,``, and every
value a string, ``event_time`` included (epoch milliseconds, the time the event was
scheduled to be sent). About a third of the events are views; only those are counted.
"""

from __future__ import annotations

CAMPAIGNS = 100
ADS_PER_CAMPAIGN = 10
#: Users and pages drawn from per generator process, as in the original.
USERS = 100
PAGES = 100
AD_TYPES = ("banner", "modal", "sponsored-search", "mail", "mobile")
EVENT_TYPES = ("view", "click", "purchase")
IP_ADDRESS = "1.2.3.4"
WINDOW_MS = 10_000

#: The schema the pipeline parses: the seven fields, all strings, in the original order.
EVENT_SCHEMA = (
    "user_id STRING, page_id STRING, ad_id STRING, ad_type STRING, "
    "event_type STRING, event_time STRING, ip_address STRING"
)


def event_head(user_id: str, page_id: str, ad_id: str, ad_type: str, event_type: str) -> str:
    """Everything of an event before the digits of its ``event_time``."""
    return (
        f'{{"user_id": "{user_id}", "page_id": "{page_id}", "ad_id": "{ad_id}", '
        f'"ad_type": "{ad_type}", "event_type": "{event_type}", "event_time": "'
    )


#: Everything of an event after the digits of its ``event_time``.
EVENT_TAIL = f'", "ip_address": "{IP_ADDRESS}"}}'


def event_json(
    user_id: str, page_id: str, ad_id: str, ad_type: str, event_type: str, event_time_ms: int
) -> str:
    return (
        event_head(user_id, page_id, ad_id, ad_type, event_type) + str(event_time_ms) + EVENT_TAIL
    )


def window_start(event_time_ms: int) -> int:
    """The original's bucket: ``floor(t / 10000) * 10000``, the window's start."""
    return event_time_ms // WINDOW_MS * WINDOW_MS
