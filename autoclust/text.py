"""Small text helpers every layer may use (a leaf: it imports nothing of autoclust)."""


def plural(count: int, word: str, words: str | None = None) -> str:
    """`1 cluster`, `2 clusters`, `0 clusters` (`words` for irregular plurals)."""
    return f"{count} {word if count == 1 else (words or word + 's')}"
