#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Every long option a tool accepts (its getopt_long table in tools/<tool>.c) is described in its
# man page (packaging/man/<tool>.1). Prints TAP; a missing option is named. Then a negative
# control: an option removed from a copy of a man page must be reported.
set -u
cd "$(dirname "$0")/.."

missing() { # tool-source man-page: the long options of the source that the page does not name
	local src=$1 page=$2 o
	# the option tables: lines like { "name", required_argument, NULL, X },
	for o in $(grep -oE '^\s*\{ *"[a-z0-9-]+", *(no|required|optional)_argument' "$src" |
		sed -E 's/^\s*\{ *"([a-z0-9-]+)".*/\1/' | sort -u); do
		# roff writes a hyphen as \- (or plain -)
		sed 's/\\-/-/g' "$page" | grep -qE -- "(^|[^a-z0-9-])--$o([^a-z0-9-]|$)" || echo "$o"
	done
}

n=0 fail=0
for page in packaging/man/*.1; do
	tool=$(basename "$page" .1)
	src=tools/$tool.c
	[ -f "$src" ] || continue
	n=$((n + 1))
	m=$(missing "$src" "$page" | tr '\n' ' ')
	if [ -z "$m" ]; then
		echo "ok $n - $tool.1 describes every long option of $tool"
	else
		echo "not ok $n - $tool.1 lacks: $m"
		fail=1
	fi
done
# negative control: a page with one option taken out is caught
n=$((n + 1))
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
grep -v -- 'hello\\-timeout\|hello-timeout' packaging/man/upcie-served.1 >"$tmp"
if missing tools/upcie-served.c "$tmp" | grep -qx hello-timeout-ms; then
	echo "ok $n - negative control: an option taken out of the page is reported"
else
	echo "not ok $n - negative control: an option taken out of the page went unseen"
	fail=1
fi
echo "1..$n"
exit $fail
