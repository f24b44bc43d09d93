#!/usr/bin/env python3
"""
check_unicode_tables.py: compares unicode_tables.h, code point by code point, with Python's `regex` module (the
pre-tokenizer's reference: GPT-2's pattern was written for it): every code point must be letter (\\p{L}), number
(\\p{N}), space (\\s) or other exactly as regex says. The two agree only when regex's Unicode version is the table's
(regex 2026.5.9 is at Unicode 17.0.0). Run from the repository root (Debian: apt-get install python3-regex):

    python3 dev/data/check_unicode_tables.py
"""
import re
import sys

import regex

text = open("unicode_tables.h").read()
version = re.search(r'UNICODE_TABLES_VERSION "([^"]+)"', text).group(1)
cls = {}
for lo, hi, c in re.findall(r"\{0x([0-9A-F]+), 0x([0-9A-F]+), (\d)\}", text):
    for cp in range(int(lo, 16), int(hi, 16) + 1):
        cls[cp] = int(c)
bad = []
for cp in range(0x110000):
    if 0xD800 <= cp <= 0xDFFF:  # surrogates are not characters (and never decoded: tokenizer.h treats them as invalid)
        continue
    ch = chr(cp)
    want = 3 if regex.match(r"\s", ch) else 1 if regex.match(r"\p{L}", ch) else 2 if regex.match(r"\p{N}", ch) else 0
    if cls.get(cp, 0) != want:
        bad.append(cp)
print("unicode_tables.h (Unicode %s) vs regex %s: %d disagreements%s" % (version, regex.__version__, len(bad),
      "" if not bad else ", the first: " + " ".join("U+%04X" % cp for cp in bad[:10])))
sys.exit(1 if bad else 0)
