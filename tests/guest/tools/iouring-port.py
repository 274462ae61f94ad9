#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Apply the io_uring dma-buf registered-buffer series to a Debian 7.x linux-source tree.

usage: iouring-port.py SERIES_DIR SOURCE_TREE

SERIES_DIR holds the series' patches (NNNN-*.patch, applied in name order); they are read at run
time and never stored in this repository. Each patch goes through patch(1); the hunks it rejects
because the tree moved on since the series' base are applied again here, after rewriting both
sides of the hunk with the rules below (facts about the newer tree, not code of the series), and
matched with whitespace-insensitive comparison and trimmed context. A hunk that still finds no
unique place fails the port. Then the few edits the newer tree needs beyond the series (EDITS).
Prints what it did; exits non-zero on any failure.
"""
import os
import re
import subprocess
import sys

# Patches the tree already carries (the series' block/bio clone change went upstream).
UPSTREAM = {"0003"}

# Rules for rejected hunks: (regex over the hunk's text, replacement). The tree dropped the
# last_hpage argument of io_sqe_buffer_register() (huge-page accounting moved to an xarray),
# renamed bio_iov_bvec_set() to bio_iov_iter_set() (now returning bool), and block devices'
# fop_flags gained FOP_DONTCACHE.
RULES = [
    (re.compile(r",\s*struct page \*\*last_hpage\)"), ")"),
    (re.compile(r", &last_hpage\)"), ")"),
    (re.compile(r"^\tstruct page \*last_hpage = NULL;\n", re.M), ""),
    (re.compile(r"^void bio_iov_bvec_set\(struct bio \*bio, const struct iov_iter \*iter\);$", re.M),
     "bool bio_iov_iter_set(struct bio *bio, const struct iov_iter *iter);"),
    (re.compile(r"\.fop_flags\t= FOP_BUFFER_RASYNC,"), ".fop_flags\t= FOP_BUFFER_RASYNC | FOP_DONTCACHE,"),
]

# Hunks whose code the newer tree restructured, so no rewrite of the hunk fits: the port's own
# edit replaces them, keyed by (patch, file, the first added line of the hunk).
OWN = {
    # __blkdev_direct_IO_async() now calls bio_iov_iter_set() for bvec iterators and the page
    # pinning otherwise; a dma-buf map iterator is set up first.
    ("0004", "block/fops.c", "} else if (iov_iter_is_dmabuf_map(iter)) {"): (
        "\tif (!bio_iov_iter_set(bio, iter)) {\n"
        "\t\tret = blkdev_iov_iter_get_pages(bio, iter, bdev);\n",
        "\tif (iov_iter_is_dmabuf_map(iter)) {\n"
        "\t\tbio_dmabuf_map_set(bio, iter);\n"
        "\t} else if (!bio_iov_iter_set(bio, iter)) {\n"
        "\t\tret = blkdev_iov_iter_get_pages(bio, iter, bdev);\n",
    ),
}

# Identifiers the newer tree renamed, replaced in every file the series touched (the tree itself
# no longer has the old names): struct bvec_iter's bi_bvec_done is bi_offset.
RENAMES = [(re.compile(r"\bbi_bvec_done\b"), "bi_offset")]

# Edits beyond the series: the newer tree walks a registered buffer's pages to unaccount huge
# pages (on unregister and when cloning buffers); a dma-buf buffer has no pages.
EDITS = [
    ("io_uring/rsrc.c",
     "\tif (imu->flags & IO_REGBUF_F_KBUF || !ctx->user)\n\t\treturn 0;\n",
     "\tif (imu->flags & (IO_REGBUF_F_KBUF | IO_REGBUF_F_DMABUF) || !ctx->user)\n\t\treturn 0;\n",
     2, "huge-page accounting skips dma-buf buffers"),
    # A fixed read or write is imported again when it is issued again (the block layer's -EAGAIN
    # for a nowait bio it would have to split, then io-wq): each import took a reference to the
    # dma-buf's map and only the last was dropped, so the map never went and unregistering hung
    # in io_dmabuf_token_release_work. A request keeps the map it already holds.
    ("io_uring/rsrc.c",
     "\tmap = io_dmabuf_get_map(&db->token);\n",
     "\tif (req->flags & REQ_F_DROP_DMABUF) {\n"
     "\t\t/* issued again: keep the map this request holds a reference to */\n"
     "\t\tiov_iter_dmabuf_map(iter, ddir, req->dmabuf_map, offset, len);\n"
     "\t\treturn 0;\n"
     "\t}\n"
     "\tmap = io_dmabuf_get_map(&db->token);\n",
     1, "a request issued again keeps its map"),
    # io_register_dmabuf()'s error path frees an imu taken from the cache before its nr_bvecs
    # was set; io_free_imu() decides by nr_bvecs whether it came from the cache.
    ("io_uring/rsrc.c",
     "err:\n\tkfree(regbuf);\n\tif (imu)\n\t\tio_free_imu(ctx, imu);\n",
     "err:\n\tkfree(regbuf);\n\tif (imu) {\n\t\timu->nr_bvecs = 0;\n\t\tio_free_imu(ctx, imu);\n\t}\n",
     1, "the registration's error path sets nr_bvecs before freeing"),
]


def norm(line):
    return " ".join(line.split())


def parse_rej(text):
    """-> [(file, [(tag, line)])] for every hunk of a context-format-free unified .rej."""
    hunks, cur_file, cur = [], None, None
    for line in text.split("\n"):
        if line.startswith("--- "):
            cur_file = line[4:].split("\t")[0].strip()
            continue
        if line.startswith("+++ "):
            continue
        if line.startswith("@@"):
            cur = []
            hunks.append((cur_file, cur))
            continue
        if cur is None or line == "\\ No newline at end of file":
            continue
        if line == "":
            continue
        tag, body = line[0], line[1:]
        if tag not in " +-":
            continue
        cur.append((tag, body))
    return hunks


def rewrite(items):
    """Apply RULES to both sides of a hunk; returns (old_lines, new_lines, items)."""
    # rewrite the two sides as text, then re-split: rules may join or drop lines
    old = "".join(b + "\n" for t, b in items if t != "+")
    new = "".join(b + "\n" for t, b in items if t != "-")
    for rx, rep in RULES:
        old = rx.sub(rep, old)
        new = rx.sub(rep, new)
    return old.split("\n")[:-1], new.split("\n")[:-1]


def find_unique(lines, pat):
    n, m, hits = len(lines), len(pat), []
    if m == 0:
        return -1
    npat = [norm(p) for p in pat]
    first = npat[0]
    for i in range(n - m + 1):
        if norm(lines[i]) != first:
            continue
        if all(norm(lines[i + k]) == npat[k] for k in range(1, m)):
            hits.append(i)
            if len(hits) > 1:
                return -2
    return hits[0] if hits else -1


def apply_hunk(tree, fname, old, new):
    """Replace old by new in fname, trimming common leading/trailing context until unique."""
    path = os.path.join(tree, fname)
    with open(path) as f:
        lines = f.read().split("\n")
    lead = 0
    while lead < min(len(old), len(new)) and old[lead] == new[lead]:
        lead += 1
    trail = 0
    while trail < min(len(old), len(new)) - lead and old[-1 - trail] == new[-1 - trail]:
        trail += 1
    # try the full context first, then drop context lines from the ends, keeping one anchor
    for drop_l in range(0, lead + 1):
        for drop_t in range(0, trail + 1):
            if drop_l == lead and drop_t == trail and lead + trail > 0:
                continue
            o = old[drop_l:len(old) - drop_t]
            nw = new[drop_l:len(new) - drop_t]
            at = find_unique(lines, o)
            if at >= 0:
                lines[at:at + len(o)] = nw
                with open(path, "w") as f:
                    f.write("\n".join(lines))
                return drop_l, drop_t
    return None


def own_edit(tree, fname, old, new):
    path = os.path.join(tree, fname)
    with open(path) as f:
        text = f.read()
    if text.count(old) != 1:
        return False
    with open(path, "w") as f:
        f.write(text.replace(old, new))
    return True


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    series, tree = sys.argv[1], sys.argv[2]
    patches = sorted(p for p in os.listdir(series) if re.match(r"^\d{4}-.*\.patch$", p))
    if not patches:
        sys.exit(f"iouring-port: no NNNN-*.patch in {series}")
    failed = 0
    for p in patches:
        num = p[:4]
        if num in UPSTREAM:
            print(f"{p}: skipped, already in the tree")
            continue
        rej = os.path.join(tree, f".iouring-port-{num}.rej")
        with open(os.path.join(series, p)) as f:
            r = subprocess.run(["patch", "-p1", "-N", "-f", "--no-backup-if-mismatch",
                                f"--reject-file={rej}"], cwd=tree, stdin=f,
                               capture_output=True, text=True)
        fuzz = [ln for ln in r.stdout.splitlines() if "fuzz" in ln or "offset" in ln]
        if not os.path.exists(rej):
            if r.returncode != 0:
                print(r.stdout + r.stderr)
                sys.exit(f"iouring-port: {p} failed without rejects")
            print(f"{p}: applied" + (f" ({len(fuzz)} hunks at an offset or with fuzz)" if fuzz else ""))
            continue
        with open(rej) as f:
            hunks = parse_rej(f.read())
        os.unlink(rej)
        print(f"{p}: {len(hunks)} hunk(s) rejected by patch, ported:")
        for idx, (fname, items) in enumerate(hunks, 1):
            added = next((b for t, b in items if t == "+"), "").strip()
            key = (num, fname, added)
            if key in OWN:
                ok = own_edit(tree, fname, *OWN[key])
                print(f"  {fname}: rejected hunk {idx}: own edit for the newer code" + ("" if ok else " FAILED"))
                failed += not ok
                continue
            old, new = rewrite(items)
            res = apply_hunk(tree, fname, old, new)
            if res is None:
                print(f"  {fname}: rejected hunk {idx}: FAILED, no unique place")
                failed += 1
            else:
                print(f"  {fname}: rejected hunk {idx}: rewritten, context trimmed {res[0]}+{res[1]}")
    touched = set()
    for p in patches:
        if p[:4] in UPSTREAM:
            continue
        with open(os.path.join(series, p)) as f:
            touched.update(m.group(1) for m in re.finditer(r"^\+\+\+ b/(\S+)", f.read(), re.M))
    for fname in sorted(touched):
        path = os.path.join(tree, fname)
        with open(path) as f:
            text = f.read()
        out = text
        for rx, rep in RENAMES:
            out = rx.sub(rep, out)
        if out != text:
            with open(path, "w") as f:
                f.write(out)
            print(f"renamed in {fname}: bi_bvec_done -> bi_offset")
    for fname, old, new, count, why in EDITS:
        path = os.path.join(tree, fname)
        with open(path) as f:
            text = f.read()
        if text.count(old) != count:
            print(f"edit {fname} ({why}): expected {count} place(s), found {text.count(old)}: FAILED")
            failed += 1
            continue
        with open(path, "w") as f:
            f.write(text.replace(old, new))
        print(f"edit {fname}: {count} place(s): {why}")
    if failed:
        sys.exit(f"iouring-port: {failed} hunk(s) or edit(s) failed")
    print("iouring-port: done")


if __name__ == "__main__":
    main()
