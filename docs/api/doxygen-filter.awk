# SPDX-License-Identifier: BSD-3-Clause
# Doxygen input filter for upcie's headers (docs/api/Doxyfile.in, INPUT_FILTER). The headers
# document with plain C comments, the style of the code they sit in, rather than Doxygen
# markup; this turns them into what Doxygen reads, line for line (line numbers stay right):
# - the header's opening paragraph (its first comment after the SPDX line) becomes the file's
#   description (/** @file);
# - a comment at column 0 directly followed by a declaration at column 0 (function, struct,
#   enum, union, typedef, macro) becomes that declaration's documentation (/**);
# - a comment after a struct member or enum value on its line documents that member (/**<).
# Other comments (inside functions, before #if, separated by a blank line) stay plain.
# mawk and gawk alike: no gawk extensions.
function flush(next_line,   i, doc) {
	doc = (next_line ~ /^[A-Za-z_#]/ && next_line !~ /^#[ \t]*(if|ifdef|ifndef|elif|else|endif|include)/)
	if (!seen_intro && !is_spdx) {
		seen_intro = 1
		if (buf[1] == "/*")
			buf[1] = "/** @file"
		else {
			sub(/^\/\*/, "/**", buf[1])
			sub(/\*\/[ \t]*$/, "@file */", buf[nbuf])
		}
		doc = 1
	} else if (doc)
		sub(/^\/\*/, "/**", buf[1])
	for (i = 1; i <= nbuf; i++)
		print(doc ? esc(buf[i]) : buf[i])
	nbuf = 0
}
# "<bdf>" and "#if" in prose are text, not HTML tags or links for Doxygen.
function esc(s,   out, c) {
	out = ""
	while (match(s, /[<#][A-Za-z]/)) {
		out = out substr(s, 1, RSTART - 1) "\\" substr(s, RSTART, 1)
		s = substr(s, RSTART + 1)
	}
	return out s
}
{
	line = $0
	if (nbuf > 0 && !in_comment) {
		# a finished column-0 comment waits for the line after it
		flush(line)
	}
	if (in_comment) {
		buf[++nbuf] = line
		if (line ~ /\*\//)
			in_comment = 0
		next
	}
	if (line ~ /^\/\*[^*]/ || line ~ /^\/\*$/) {
		nbuf = 1
		buf[1] = line
		is_spdx = (line ~ /SPDX-License-Identifier/)
		in_comment = (line !~ /\*\//)
		if (is_spdx && !in_comment) {
			print line
			nbuf = 0
		}
		next
	}
	# a member's trailing comment
	if (line ~ /^[ \t]+[^ \t\/*].*[;,][ \t]*\/\*[^*]/) {
		i = index(line, "/*")
		line = substr(line, 1, i - 1) "/**<" esc(substr(line, i + 2))
	}
	print line
}
END {
	if (nbuf > 0)
		flush("")
}
