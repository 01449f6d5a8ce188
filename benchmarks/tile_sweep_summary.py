"""The best configs per (package, T, GEMM) of decode_gemm_tiles.py's printed rows, beside the
shipped one's time. It reads the printed rows, not the JSON: a sweep cut short (a time limit, a
crash) prints every row it measured, but writes the JSON only at its end.

    python benchmarks/tile_sweep_summary.py $OUT/tiles.txt
"""

from __future__ import annotations

import ast
import sys


def main() -> None:
    rows = [ast.literal_eval(line) for line in open(sys.argv[1]) if line.startswith("{")]
    for key in sorted({(r["package"], r["tokens"], r["stage"]) for r in rows}):
        timed = [
            r for r in rows if (r["package"], r["tokens"], r["stage"]) == key
            and isinstance(r["us"], float)
        ]  # fmt: skip
        shipped = next((r["us"] for r in timed if r["shipped"]), None)
        print(*key, "shipped", shipped)
        for r in sorted(timed, key=lambda r: r["us"])[:3]:
            c = r["config"]
            tile = (
                c["BLOCK_N"],
                c["num_stages"],
                c["num_warps"],
                c.get("SWAP_AB"),
                c.get("FP8_ACC"),
                c["GROUP_SIZE_M"],
            )
            print("   ", r["us"], "close" if r["close_to_shipped"] else "FAR", tile)


if __name__ == "__main__":
    main()
