"""Event routing: which queues a published event goes to, by their binding patterns.

An event name is dot-separated segments (`user.42.updated`). In a pattern, a segment `*`
matches exactly one segment and `#` zero or more (protocol/rules.py). Patterns without
wildcards are looked up in a dict; the others live in a segment trie, so matching an event
costs about its number of segments (times the wildcard branches it meets), not the number of
bindings. A queue bound by two patterns that both match gets the event once: `match` returns
a set.

Queues are named, not held: this part knows nothing of the queue table.
"""

from __future__ import annotations

from functools import lru_cache

from ..protocol.rules import ANY_SEGMENTS, ONE_SEGMENT


class _Node:
    """A trie node: the patterns that end here (by queue), and where each next segment
    leads. A node reached through `#` also matches any further segment (it loops)."""

    __slots__ = ("any", "children", "loops", "one", "queues")

    def __init__(self, loops: bool = False) -> None:
        self.children: dict[str, _Node] = {}
        self.one: _Node | None = None  # the child for `*`
        self.any: _Node | None = None  # the child for `#`
        self.loops = loops
        self.queues: set[str] = set()

    def empty(self) -> bool:
        return not (self.children or self.one or self.any or self.queues)


class Bindings:
    __slots__ = ("_by_queue", "_exact", "_root", "total")

    def __init__(self) -> None:
        self._exact: dict[str, set[str]] = {}
        self._root = _Node()
        #: Each queue's patterns, in the order they were bound.
        self._by_queue: dict[str, dict[str, None]] = {}
        #: Bindings of all queues together.
        self.total = 0

    def __len__(self) -> int:
        return self.total

    def count(self, queue: str) -> int:
        return len(self._by_queue.get(queue, ()))

    def patterns(self, queue: str) -> list[str]:
        return list(self._by_queue.get(queue, ()))

    def bind(self, queue: str, pattern: str) -> bool:
        """Bind `queue` to a (valid) pattern; False if it already was."""
        patterns = self._by_queue.setdefault(queue, {})
        if pattern in patterns:
            return False
        patterns[pattern] = None
        self.total += 1
        if _is_exact(pattern):
            self._exact.setdefault(pattern, set()).add(queue)
        else:
            self._node_for(pattern.split(".")).queues.add(queue)
        return True

    def unbind(self, queue: str, pattern: str) -> bool:
        """Remove one binding; False if there was none."""
        patterns = self._by_queue.get(queue)
        if patterns is None or pattern not in patterns:
            return False
        del patterns[pattern]
        self.total -= 1
        if not patterns:
            del self._by_queue[queue]
        if _is_exact(pattern):
            queues = self._exact[pattern]
            queues.discard(queue)
            if not queues:
                del self._exact[pattern]
        else:
            self._remove(self._root, pattern.split("."), 0, queue)
        return True

    def unbind_all(self, queue: str) -> list[str]:
        """Remove every binding of `queue` (it is deleted); the patterns it had."""
        patterns = self.patterns(queue)
        for pattern in patterns:
            self.unbind(queue, pattern)
        return patterns

    def match(self, event: str) -> set[str]:
        """The queues bound by a pattern that matches the (valid) event name."""
        found = set(self._exact.get(event, ()))
        root = self._root
        if root.empty():
            return found
        active = _closure([root])
        for segment in event.split("."):
            following: list[_Node] = []
            for node in active:
                if node.loops:
                    following.append(node)
                child = node.children.get(segment)
                if child is not None:
                    following.append(child)
                if node.one is not None:
                    following.append(node.one)
            if not following:
                return found
            active = _closure(following)
        for node in active:
            found |= node.queues
        return found

    # ----------------------------------------------------------------- the trie

    def _node_for(self, segments: list[str]) -> _Node:
        node = self._root
        for segment in segments:
            if segment == ONE_SEGMENT:
                if node.one is None:
                    node.one = _Node()
                node = node.one
            elif segment == ANY_SEGMENTS:
                if node.any is None:
                    node.any = _Node(loops=True)
                node = node.any
            else:
                child = node.children.get(segment)
                if child is None:
                    child = node.children[segment] = _Node()
                node = child
        return node

    def _remove(self, node: _Node, segments: list[str], index: int, queue: str) -> bool:
        """Remove `queue` at the end of the path; prune nodes left empty. Returns whether
        `node` is now empty."""
        if index == len(segments):
            node.queues.discard(queue)
            return node.empty()
        segment = segments[index]
        if segment == ONE_SEGMENT:
            child = node.one
        elif segment == ANY_SEGMENTS:
            child = node.any
        else:
            child = node.children.get(segment)
        if child is not None and self._remove(child, segments, index + 1, queue):
            if segment == ONE_SEGMENT:
                node.one = None
            elif segment == ANY_SEGMENTS:
                node.any = None
            else:
                del node.children[segment]
        return node.empty()


def mask_matches(mask: str, text: str) -> bool:
    """Whether `text` (an event name, or a pattern read as one) matches the mask: `*` is
    one segment, `#` zero or more (`rebind --remove-mask`)."""
    return _segments_match(mask.split("."), text.split("."))


def _segments_match(mask: list[str], text: list[str]) -> bool:
    # Positions in `text` the mask can have reached; `#` may stay or move on.
    reachable = {0}
    for segment in mask:
        if segment == ANY_SEGMENTS:
            reachable = set(range(min(reachable), len(text) + 1)) if reachable else set()
        else:
            reachable = {
                i + 1
                for i in reachable
                if i < len(text) and (segment == ONE_SEGMENT or segment == text[i])
            }
        if not reachable:
            return False
    return len(text) in reachable


def pattern_covers(mask: str, pattern: str) -> bool:
    """Whether every event name that `pattern` matches also matches `mask` (a subscribe
    right covering a binding). Sound: never True for a pattern that reaches further."""
    return _covers(tuple(mask.split(".")), tuple(pattern.split(".")))


@lru_cache(maxsize=4_096)
def _covers(mask: tuple[str, ...], pattern: tuple[str, ...]) -> bool:
    if not mask:
        return not pattern
    head, rest = mask[0], mask[1:]
    if head == ANY_SEGMENTS:
        # `#` matches nothing more, or absorbs the pattern's next segment (a `#` included).
        return _covers(rest, pattern) or (bool(pattern) and _covers(mask, pattern[1:]))
    if not pattern or pattern[0] == ANY_SEGMENTS:
        return False  # one fixed segment cannot cover "none or many"
    if head == ONE_SEGMENT or head == pattern[0]:
        return _covers(rest, pattern[1:])
    return False


def _is_exact(pattern: str) -> bool:
    return ONE_SEGMENT not in pattern and ANY_SEGMENTS not in pattern


def _closure(nodes: list[_Node]) -> list[_Node]:
    """The nodes, and every node reachable from them through `#` consuming nothing, once
    each."""
    seen: dict[int, _Node] = {}
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen[id(node)] = node
        if node.any is not None:
            stack.append(node.any)
    return list(seen.values())
