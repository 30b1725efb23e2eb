#!/usr/bin/env python3
# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
"""What best-fit placement alone costs on 2 MiB granules: a model, not the engine.

Replays a lifetime list (`cistern convert --to lifetimes TRACE OUT.csv`) through a plain best fit -
requests rounded to 512 B; those of at most 1 MiB in one address range, larger ones in another;
each request takes the smallest free block that holds it (the lowest address among equals) from
its start; freed blocks coalesce with free neighbours - and counts as mapped only the 2 MiB
granules that live blocks touch, as if every free granule went back to the device at once and
no handle were larger than a granule. It prints the most granules mapped at any time (after each
allocation) / peak_live: what a device of that size needs under this placement, whatever an
engine keeps. docs/design.md ("Crowded cuts") compares it with cistern's min_capacity; where
cistern needs about as much, what is left is placement, not what the engine keeps mapped.

With --first-fit, a request takes the free block of the lowest address that holds it instead.
With --end, a request goes at the end of its free block instead of its start where that touches
fewer granules that no live block touches (docs/design.md: measured, not the engine's rule).

Usage: scripts/granule_model.py [--first-fit] [--end] LIFETIMES.csv...
Prints one line per file: its name, peak_live in bytes and the ratio.
"""
import argparse
import csv
import sys

GRANULE = 2 << 20
SMALL = 1 << 20
ROUND = 512


class Range:
    """Free blocks of one address range, by start address; best fit (or first fit) by scanning."""

    def __init__(self, base, size, first_fit):
        self.free = {base: size}
        self.first_fit = first_fit

    def take(self, size, fresh=None):
        """The address for `size`; `fresh(lo, hi)`, when given, counts the granules [lo, hi) would
        add, and the block's end is taken where it adds fewer than its start."""
        best = None
        for addr, n in self.free.items():
            if n < size:
                continue
            key = (addr,) if self.first_fit else (n, addr)
            if best is None or key < best[2]:
                best = (addr, n, key)
        if best is None:
            raise RuntimeError("address range exhausted")
        addr, n, _ = best
        del self.free[addr]
        top = addr + n - size
        if n > size and fresh is not None and fresh(top, top + size) < fresh(addr, addr + size):
            self.free[addr] = n - size
            return top
        if n > size:
            self.free[addr + size] = n - size
        return addr

    def give(self, addr, size):
        after = self.free.pop(addr + size, None)
        if after is not None:
            size += after
        for start, n in self.free.items():
            if start + n == addr:
                del self.free[start]
                addr, size = start, size + n
                break
        self.free[addr] = size


def granules(lo, hi):
    """The granules that bytes [lo, hi) touch."""
    return range(lo // GRANULE, (hi - 1) // GRANULE + 1)


def events(path):
    with open(path, newline="", encoding="utf-8") as f:
        rows = [(int(r["lower"]), int(r["upper"]), int(r["size"])) for r in csv.DictReader(f)]
    out = []
    for i, (lower, upper, size) in enumerate(rows):
        out.append((lower, 1, i, size))  # frees at a time come before allocations at it
        out.append((upper, 0, i, size))
    out.sort()
    return out


def model(path, first_fit=False, end=False):
    small, large = Range(0, 1 << 40, first_fit), Range(1 << 41, 1 << 44, first_fit)
    touched, placed = {}, {}
    live = peak_live = mapped = most = 0

    def touch(addr, size, delta):
        nonlocal mapped
        for g in granules(addr, addr + size):
            count = touched.get(g, 0) + delta
            if count == 0:
                del touched[g]
                mapped -= 1
            else:
                if count == 1 and delta > 0:
                    mapped += 1
                touched[g] = count

    def fresh(lo, hi):
        return sum(1 for g in granules(lo, hi) if g not in touched)

    for _, kind, i, size in events(path):
        if kind == 0:
            addr, rounded, where = placed.pop(i)
            where.give(addr, rounded)
            touch(addr, rounded, -1)
            live -= size
            continue
        rounded = max(ROUND, (size + ROUND - 1) // ROUND * ROUND)
        where = small if rounded <= SMALL else large
        addr = where.take(rounded, fresh if end else None)
        placed[i] = (addr, rounded, where)
        touch(addr, rounded, 1)
        live += size
        peak_live = max(peak_live, live)
        most = max(most, mapped)
    return peak_live, most * GRANULE


def main():
    p = argparse.ArgumentParser(description="What placement alone needs on 2 MiB granules.")
    p.add_argument("--first-fit", action="store_true", help="the lowest free block that holds it")
    p.add_argument("--end", action="store_true",
                   help="at the block's end where that touches fewer new granules")
    p.add_argument("lifetimes", nargs="+", help="lifetime lists (cistern convert --to lifetimes)")
    a = p.parse_args()
    for path in a.lifetimes:
        peak_live, need = model(path, a.first_fit, a.end)
        ratio = need / peak_live if peak_live else 0.0
        print(f"{path} {peak_live} {ratio:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
