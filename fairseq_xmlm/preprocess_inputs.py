"""fairseq-preprocess with `--user-dir fairseq_xmlm`: its text inputs are checked before fairseq reads them.

fairseq-preprocess stops on a missing input with a traceback, and on invalid UTF-8 with one that names no file
("negative seek position -1"), after it has created --destdir and its preprocess.log. With the plugin loaded, every
text file it would read (--trainpref, --validpref, --testpref, each comma-separated, per language; --srcdict,
--tgtdict) is read through first, and a missing, empty or non-UTF-8 one is an XmlmError: one `error: ...` line.
"""
import functools
import sys

from fairseq_xmlm.data.corpus import check_corpus


def input_files(args):
    """The text files fairseq-preprocess reads for its parsed arguments (named as fairseq_cli.preprocess does)."""
    langs = [args.source_lang] if args.only_source else [args.source_lang, args.target_lang]
    for prefixes in (args.trainpref, args.validpref, args.testpref):
        for prefix in filter(None, (prefixes or "").split(",")):
            yield from (prefix + (f".{lang}" if lang else "") for lang in langs)
    yield from filter(None, (args.srcdict, args.tgtdict))


def _checking_inputs(main):
    @functools.wraps(main)
    def checked_main(args):
        for path in input_files(args):
            check_corpus(path)
        return main(args)

    checked_main.checks_inputs = True
    return checked_main


def install():
    """When fairseq-preprocess is the running program (its console script or `python -m fairseq_cli.preprocess`),
    check its inputs before its `main` runs: the plugin is imported while it parses its arguments, and `cli_main`
    looks `main` up in its module when it calls it."""
    for module in (sys.modules.get("fairseq_cli.preprocess"), sys.modules.get("__main__")):
        spec = getattr(module, "__spec__", None)
        if getattr(spec, "name", None) == "fairseq_cli.preprocess" and not getattr(module.main, "checks_inputs", 0):
            module.main = _checking_inputs(module.main)
