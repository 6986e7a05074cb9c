"""Check the internal links of the built docs and of markdown files, offline.

    python3 docs/check_links.py docs/_build/html README.md

An HTML folder: every href and src of every page that is not an external URL (http:, https:, mailto:, ...) must
name a file of the build, and its #fragment an id in that file. A markdown file: every link and image target that
is not an external URL must be a file or folder of the repository (relative to the markdown file), inside it.
Prints one line per broken link and exits 1 when there is one (Sphinx's own linkcheck needs the network).
"""

import html.parser
import pathlib
import re
import sys
import urllib.parse

REPOSITORY = pathlib.Path(__file__).resolve().parent.parent


class _Links(html.parser.HTMLParser):
    """The ids of a page and the targets of its links."""

    def __init__(self):
        super().__init__()
        self.ids, self.targets = set(), []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("id", "name") and value:
                self.ids.add(value)
            if value and ((name == "href" and tag in ("a", "link")) or (name == "src" and tag in ("img", "script"))):
                self.targets.append(value)


def _external(target: str) -> bool:
    return bool(urllib.parse.urlsplit(target).scheme)


def html_problems(folder: pathlib.Path) -> list[str]:
    pages = {path.resolve(): _Links() for path in folder.rglob("*.html")}
    for path, links in pages.items():
        links.feed(path.read_text(encoding="utf-8"))
    problems = []
    for path, links in pages.items():
        for target in links.targets:
            if _external(target):
                continue
            parts = urllib.parse.urlsplit(target)
            file = (path.parent / urllib.parse.unquote(parts.path)).resolve() if parts.path else path
            if file.is_dir():
                file = file / "index.html"
            where = f"{path.relative_to(folder.resolve())}: {target}"
            if not file.exists():
                problems.append(f"{where}: no file {file}")
            elif parts.fragment and file in pages and urllib.parse.unquote(parts.fragment) not in pages[file].ids:
                problems.append(f"{where}: no id {parts.fragment!r} in {file.name}")
    return problems


_MARKDOWN_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_CODE = re.compile(r"^```.*?^```|^(?:    .*\n)+|`[^`\n]*`", re.M | re.S)  # fenced, indented and inline code


def markdown_problems(path: pathlib.Path) -> list[str]:
    problems = []
    for target in _MARKDOWN_LINK.findall(_CODE.sub("", path.read_text(encoding="utf-8"))):
        if _external(target) or target.startswith("#"):
            continue
        file = (path.parent / urllib.parse.unquote(target.split("#")[0])).resolve()
        if not file.exists():
            problems.append(f"{path.name}: {target}: no such file")
        elif not file.is_relative_to(REPOSITORY):
            problems.append(f"{path.name}: {target}: outside the repository")
    return problems


def main(arguments: list[str]) -> int:
    problems = []
    for argument in arguments:
        path = pathlib.Path(argument)
        problems += html_problems(path) if path.is_dir() else markdown_problems(path)
    print("\n".join(problems) or f"internal links: all resolve ({', '.join(arguments)})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
