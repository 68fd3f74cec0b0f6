#!/usr/bin/env python3
"""Writes data/gpt/corpus.txt, the text the built-in `gpt` workload trains on.

The text is generated (no third-party text, no license): sentences from a small grammar with
agreement, clauses, numbers and punctuation, so that a byte-level model has structure to learn
at several scales. Python's `random.Random(2026)` makes it byte for byte reproducible:

    python3 scripts/make-corpus.py && git diff --exit-code data/gpt/corpus.txt
"""
import pathlib
import random

rng = random.Random(2026)
NOUNS = ["fox", "bird", "river", "stone", "lamp", "garden", "ship", "tower", "cat", "clock",
         "baker", "road", "storm", "letter", "window", "forest", "miller", "bridge", "candle", "field"]
ADJS = ["quick", "small", "old", "quiet", "bright", "heavy", "green", "distant", "cold", "patient",
        "narrow", "golden", "tired", "wooden", "sudden", "gentle"]
VERBS = [("sees", "see"), ("finds", "find"), ("follows", "follow"), ("carries", "carry"),
         ("watches", "watch"), ("builds", "build"), ("remembers", "remember"), ("crosses", "cross"),
         ("opens", "open"), ("hears", "hear")]
PLACES = ["near the river", "under the bridge", "in the garden", "at the tower", "by the window",
          "across the field", "behind the mill", "on the old road", "inside the forest"]
TIMES = ["at dawn", "before the storm", "after supper", "every morning", "in winter", "at noon",
         "once a year", "late at night"]
CONNECT = ["and", "but", "while", "because", "so"]


def noun_phrase(plural):
    noun = rng.choice(NOUNS)
    if plural:
        noun = noun + ("es" if noun.endswith(("s", "x", "ch", "sh")) else "s")
    det = rng.choice(["the", "some", "two", "many"]) if plural else rng.choice(["the", "a", "one", "that"])
    if det == "a" and rng.random() < 0.6:
        adj = rng.choice(ADJS)
        det = "an" if adj[0] in "aeiou" else "a"
        return f"{det} {adj} {noun}"
    if rng.random() < 0.5:
        return f"{det} {rng.choice(ADJS)} {noun}"
    return f"{det} {noun}"


def clause():
    plural = rng.random() < 0.35
    subject = noun_phrase(plural)
    third, base = rng.choice(VERBS)
    verb = base if plural else third
    parts = [subject, verb, noun_phrase(rng.random() < 0.3)]
    if rng.random() < 0.5:
        parts.append(rng.choice(PLACES))
    if rng.random() < 0.3:
        parts.append(rng.choice(TIMES))
    return " ".join(parts)


def sentence():
    text = clause()
    if rng.random() < 0.4:
        text += f" {rng.choice(CONNECT)} {clause()}"
    if rng.random() < 0.1:
        text += f", {rng.randint(2, 99)} times"
    end = rng.choices([".", "!", "?"], weights=[8, 1, 1])[0]
    return text[0].upper() + text[1:] + end


def main():
    paragraphs = []
    size = 0
    while size < 96 * 1024:
        paragraph = " ".join(sentence() for _ in range(rng.randint(3, 7)))
        paragraphs.append(paragraph)
        size += len(paragraph) + 2
    out = pathlib.Path(__file__).resolve().parent.parent / "data" / "gpt" / "corpus.txt"
    out.write_text("\n\n".join(paragraphs) + "\n", encoding="ascii")
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
