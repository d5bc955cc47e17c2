#!/usr/bin/env python3
"""check-shape.py — the house rules on size (issue 34): no .cpp/.cu outside tests/ over 500 lines,
no header over 250, no tools/cmd_*.cpp (one command each) over 150, no function over 80 lines (from
the line of its opening brace's signature to its closing brace). Prints each offence; exits 1 if any. `--list N` prints the N longest functions.

Functions are found by a small brace scanner, not a parser: a `{` whose statement so far holds a
`(` and does not start with a control keyword, opened directly inside a namespace, a class or at
file level, starts a function; strings, characters and comments are skipped."""
import os, re, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONTROL = re.compile(r'^\s*(if|for|while|switch|catch|do|else|return)\b')
CONTAINER = re.compile(r'\b(namespace|class|struct|union|enum)\b[^()]*$')


def strip_code(text):
    """The text with comments, strings and character literals blanked (line breaks kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith('//', i):
            j = text.find('\n', i)
            j = n if j < 0 else j
            out.append(' ' * (j - i)); i = j
        elif text.startswith('/*', i):
            j = text.find('*/', i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r'[^\n]', ' ', text[i:j])); i = j
        elif text.startswith('R"', i) and (i == 0 or not (text[i-1].isalnum() or text[i-1] == '_')):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = text.find(')' + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r'[^\n]', ' ', text[i:j])); i = j
        elif c in '"\'':
            if c == "'" and i > 0 and text[i-1].isalnum():  # digit separator 1'000
                out.append(' '); i += 1; continue
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == '\\' else 1
            out.append(' ' * (min(j, n - 1) + 1 - i)); i = j + 1
        else:
            out.append(c); i += 1
    return ''.join(out)


def functions(path):
    """(name line, length in lines) of each function defined in path."""
    code = strip_code(open(path, encoding='utf-8', errors='replace').read())
    stack, stmt, line, found = [], '', 1, []
    for ch in code:
        if ch == '\n':
            line += 1
        if ch == '{':
            kinds = [k for k, _ in stack]
            s = re.sub(r'\s+', ' ', stmt).strip()
            if all(k in ('ns', 'cls') for k in kinds) and '(' in s and not CONTROL.match(s) \
                    and not CONTAINER.search(s.split('(')[0]) and not s.startswith('='):
                start = line - stmt.count('\n')
                stack.append(('fn', (start, s[:70])))
            elif CONTAINER.search(s) and all(k in ('ns', 'cls') for k in kinds):
                stack.append(('ns' if 'namespace' in s else 'cls', None))
            else:
                stack.append(('blk', None))
            stmt = ''
        elif ch == '}':
            if stack:
                kind, info = stack.pop()
                if kind == 'fn':
                    found.append((info[0], line - info[0] + 1, info[1]))
            stmt = ''
        elif ch == ';':
            stmt = ''
        else:
            stmt += ch
    return found


def main():
    files = subprocess.run(['git', 'ls-files'], cwd=ROOT, capture_output=True, text=True).stdout.split()
    src = [f for f in files if re.search(r'\.(cpp|hpp|cu|cuh|h)$', f) and not f.startswith('tests/')
           and os.path.exists(os.path.join(ROOT, f))]
    bad, longest = [], []
    for f in src:
        p = os.path.join(ROOT, f)
        n = sum(1 for _ in open(p, encoding='utf-8', errors='replace'))
        limit = 250 if re.search(r'\.(hpp|cuh|h)$', f) else 150 if re.match(r'tools/cmd_.*\.cpp$', f) else 500
        if n > limit:
            bad.append(f'{f}: {n} lines (at most {limit})')
        for start, length, sig in functions(p):
            longest.append((length, f'{f}:{start}', sig))
            if length > 80:
                bad.append(f'{f}:{start}: function of {length} lines (at most 80): {sig}')
    if len(sys.argv) > 2 and sys.argv[1] == '--list':
        for length, where, sig in sorted(longest, reverse=True)[:int(sys.argv[2])]:
            print(f'{length:5d}  {where}  {sig}')
        return 0
    for b in bad:
        print(b)
    print(f'check-shape: {len(src)} files, {len(bad)} over the limits')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
