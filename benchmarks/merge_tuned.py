"""Take some buckets of a fresh `moec tune` table into a copy of a shipped one.

`moec tune --tokens 256,1024` writes a table whose buckets are tuned at those token counts
(the last one open-ended). This copies the shipped table and, for each tuned token count T,
replaces the shipped bucket whose max_tokens is T with the fresh one's configs, so a benchmark
can run the whole layer with the shipped buckets elsewhere and the fresh ones at T.

    python benchmarks/merge_tuned.py SHIPPED FRESH --tokens 256,1024 --key KEY -o MERGED
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shipped")
    parser.add_argument("fresh")
    parser.add_argument("--tokens", required=True, help="the token counts FRESH was tuned at")
    parser.add_argument("--key", required=True, help="the layer's table key")
    parser.add_argument("-o", "--out", required=True)
    args = parser.parse_args()
    shipped = json.loads(Path(args.shipped).read_text())
    fresh = json.loads(Path(args.fresh).read_text())[args.key]
    merged = [dict(bucket) for bucket in shipped[args.key]]
    for tokens, tuned in zip(map(int, args.tokens.split(",")), fresh, strict=True):
        (index,) = [i for i, b in enumerate(merged) if b["max_tokens"] == tokens]
        merged[index] = {**tuned, "max_tokens": tokens}
        old = shipped[args.key][index]
        print(f"T={tokens}: {old['gate_up']} ({old.get('ms')} ms) -> {tuned['gate_up']}")
        print(f"        down {old['down']} -> {tuned['down']} ({tuned.get('ms')} ms)")
    Path(args.out).write_text(json.dumps({**shipped, args.key: merged}, indent=1))


if __name__ == "__main__":
    main()
