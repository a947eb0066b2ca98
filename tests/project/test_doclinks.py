"""Every relative link in the README and the guides (docs/, boards/) points at a file that
exists, and a link to a heading of a Markdown file at a heading it has (GitHub's anchors:
lower case, punctuation dropped, spaces as hyphens)."""
import glob
import os
import re

from repo import ROOT  # noqa: E402
LINK = re.compile(r'\]\(([^)\s]+)\)')


def pages():
    return ([os.path.join(ROOT, 'README.md')] + sorted(glob.glob(os.path.join(ROOT, 'docs', '*.md')))
            + sorted(glob.glob(os.path.join(ROOT, 'boards', '*.md'))))


def anchors(path):
    out = set()
    with open(path, encoding='utf-8') as f:
        text = re.sub(r'```.*?```', '', f.read(), flags=re.S)
    for line in text.splitlines():
        m = re.match(r'#+\s+(.*)', line)
        if m:
            out.add(re.sub(r'[^\w\- ]', '', m.group(1).strip().lower()).replace(' ', '-'))
    return out


def broken(path):
    with open(path, encoding='utf-8') as f:
        text = re.sub(r'```.*?```', '', f.read(), flags=re.S)   # (code blocks hold no links)
    for target in LINK.findall(text):
        if re.match(r'[a-z][a-z0-9+.-]*:', target):              # http:, https:, mailto:
            continue
        file, _, frag = target.partition('#')
        dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
        if not os.path.exists(dest):
            yield f'{os.path.relpath(path, ROOT)}: {target} (no such file)'
        elif frag and dest.endswith('.md') and frag not in anchors(dest):
            yield f'{os.path.relpath(path, ROOT)}: {target} (no such heading)'


def test_relative_links_resolve():
    bad = [b for p in pages() for b in broken(p)]
    assert not bad, '\n'.join(bad)


def test_the_checker_sees_a_broken_link(tmp_path):
    page = tmp_path / 'page.md'
    page.write_text('# Title\n\n[ok](page.md#title) [gone](nowhere.md) [heading](#missing) '
                    '[web](https://example.com)\n```\n[in code](ignored.md)\n```\n')
    assert sorted(b.split(': ', 1)[1] for b in broken(str(page))) == [
        '#missing (no such heading)', 'nowhere.md (no such file)']
