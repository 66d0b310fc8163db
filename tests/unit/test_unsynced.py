"""
L{Unsynced}: the items of durable adds no reader may see yet. What it
promises on its own (the queue's use of it is in C{test_queue_visibility.py}).
"""

from __future__ import annotations

from collections import deque

from hypothesis import given
from hypothesis import strategies as st

from kestrel.item import QItem
from kestrel.unsynced import Unsynced


class Shown:
    """What readers see, with a record of the wakes and of C{all_shown}."""

    def __init__(self) -> None:
        self.visible: deque[QItem] = deque()
        self.events: list[object] = []

    def wake(self) -> None:
        self.events.append(("wake", len(self.visible)))

    def all_shown(self) -> None:
        self.events.append("all shown")

    def unsynced(self) -> Unsynced:
        return Unsynced(self.visible, self.wake, self.all_shown)


def items(count: int) -> list[QItem]:
    return [QItem(b"%d" % n, 0, 0) for n in range(count)]


def test_a_number_shows_its_item_and_every_older_one_each_with_a_wake() -> None:
    """Appended in the order held, one wake after each append; C{all_shown} once empty."""
    shown = Shown()
    unsynced = shown.unsynced()
    a, b, c = items(3)
    numbers = [unsynced.hold(a), unsynced.hold(b), unsynced.hold(c)]
    assert len(unsynced) == 3 and not shown.visible
    assert unsynced.show_through(numbers[1]) is True
    assert list(shown.visible) == [a, b] and len(unsynced) == 1
    assert shown.events == [("wake", 1), ("wake", 2)]
    assert unsynced.show_through(numbers[0]) is True  # (shown already: nothing more)
    assert unsynced.show_through(numbers[2], "a Deferred's result") is True
    assert list(shown.visible) == [a, b, c]
    assert shown.events == [("wake", 1), ("wake", 2), ("wake", 3), "all shown"]


def test_after_drop_no_number_from_before_shows_anything() -> None:
    shown = Shown()
    unsynced = shown.unsynced()
    a, b, c = items(3)
    before = [unsynced.hold(a), unsynced.hold(b)]
    unsynced.drop()
    after = unsynced.hold(c)
    for number in before:
        unsynced.show_through(number)
    assert not shown.visible and len(unsynced) == 1
    unsynced.show_through(after)
    assert list(shown.visible) == [c] and len(unsynced) == 0


def test_a_reader_woken_by_a_show_may_drop_the_rest() -> None:
    """A wake that drops what is held (memory rebuilt) ends the showing there."""
    visible: deque[QItem] = deque()
    unsynced = Unsynced(visible, lambda: unsynced.drop(), lambda: None)
    a, b = items(2)
    unsynced.hold(a)
    last = unsynced.hold(b)
    unsynced.show_through(last)
    assert list(visible) == [a] and len(unsynced) == 0
    later = unsynced.hold(b)
    unsynced.show_through(later)
    assert list(visible) == [a, b]


@given(st.lists(st.integers(min_value=0, max_value=19), max_size=40))
def test_whatever_the_order_of_numbers_items_are_shown_in_order_once(order: list[int]) -> None:
    shown = Shown()
    unsynced = shown.unsynced()
    held = items(20)
    numbers = [unsynced.hold(item) for item in held]
    for n in order:
        unsynced.show_through(numbers[n])
    count = max(order) + 1 if order else 0
    assert list(shown.visible) == held[:count]
    assert len(unsynced) == 20 - count
    assert [e for e in shown.events if e != "all shown"] == [("wake", n + 1) for n in range(count)]
