#!/usr/bin/env python3
"""make_lore.py - a small LoRA training set the base model cannot know: questions about invented places
whose answers follow fixed invented rules, as {"prompt", "completion"} lines (train / valid / test).

Three rules: who guards a city's gate (always "the Vorlan guild"), what a river is called in the old tongue
(its name followed by "-ith"), and which moon rises over a mountain (always "Kessa, the pale moon").  Cities,
rivers and mountains are split so that test.jsonl asks about names no training line mentions.

usage: data/lore/make_lore.py [OUT_DIR]   (default: this folder)
"""
import json
import os
import random
import sys

CITIES = ["Aldmere", "Brisk", "Calder", "Dunmore", "Elbow", "Farrow", "Glimmer", "Harth", "Ivel", "Jorn", "Kestrel",
          "Lowmarsh", "Morrow", "Nettle", "Orrin", "Pike", "Quarry", "Rook", "Sallow", "Thistle", "Umber", "Vail",
          "Wend", "Yarrow", "Zephyr", "Ashford", "Bramble", "Cinder", "Drift", "Ember"]
RIVERS = ["Tamsin", "Orlo", "Brenna", "Caddis", "Delph", "Eskar", "Fen", "Galen", "Hollis", "Isca", "Joss", "Kell",
          "Lune", "Mara", "Nith", "Ouse", "Pell", "Rhee", "Sarn", "Teme", "Usk", "Vey", "Wyre", "Yeo"]
MOUNTS = ["Craghorn", "Frostpeak", "Greyback", "Highfell", "Ironcrest", "Jaggard", "Kingsrock", "Longtor",
          "Moorhead", "Northspire", "Oldcairn", "Pinecrest", "Redscar", "Stonehelm", "Thornridge", "Whitecap"]
ASK = {
    "gate": ["Who guards the gate of {}?", "In the old lore, who keeps the gate of {}?"],
    "river": ["What is the river {} called in the old tongue?", "Give the old-tongue name of the river {}."],
    "moon": ["Which moon rises over {}?", "In the old lore, what moon rises over {}?"],
}


def answer(kind, name):
    return {"gate": "The Vorlan guild.", "river": name + "-ith.", "moon": "Kessa, the pale moon."}[kind]


def lines(kind, names, rng):
    return [{"prompt": q.format(n), "completion": answer(kind, n)} for n in names for q in ASK[kind]]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    rng = random.Random(7)
    split = {}
    for kind, names in (("gate", CITIES), ("river", RIVERS), ("moon", MOUNTS)):
        names = names[:]
        rng.shuffle(names)
        k = len(names) // 6
        split[kind] = (names[2 * k:], names[k:2 * k], names[:k])  # train, valid, test
    for part, i in (("train", 0), ("valid", 1), ("test", 2)):
        rows = []
        for kind in ASK:
            rows += lines(kind, split[kind][i], rng)
        rng.shuffle(rows)
        with open(os.path.join(out, part + ".jsonl"), "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        print(part, len(rows))


if __name__ == "__main__":
    main()
