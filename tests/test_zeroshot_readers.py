"""Readers for XNLI TSV, CoNLL/WikiAnn BIO and CoNLL-U, on small files written here in exactly those formats."""
import pytest

from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.zeroshot.readers import read_bio, read_conllu, read_xnli_tsv
from fairseq_xmlm.zeroshot.subwords import first_subword_index

XNLI_HEADER = ("language\tgold_label\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
               "sentence2_parse\tsentence1\tsentence2\tpromptID\tpairID\tgenre\tlabel1\tlabel2\tlabel3\tlabel4\t"
               "label5\tsentence1_tokenized\tsentence2_tokenized\tmatch")


def xnli_row(language, label, premise, hypothesis):
    return "\t".join([language, label, "", "", "", "", premise, hypothesis, "1", "1", "fiction", label, "", "", "",
                      "", premise, hypothesis, "True"])


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_xnli_release_format_filters_language(tmp_path):
    path = write(tmp_path, "xnli.dev.tsv", "\n".join([
        XNLI_HEADER,
        xnli_row("en", "entailment", 'He said "yes".', "He agreed."),
        xnli_row("fr", "contradiction", "Il a dit oui.", "Il a refusé."),
        xnli_row("en", "neutral", "A man sleeps.", "A man dreams."),
    ]) + "\n")
    english = read_xnli_tsv(path, language="en")
    assert [(e.premise, e.hypothesis, e.label) for e in english] == [
        ('He said "yes".', "He agreed.", "entailment"), ("A man sleeps.", "A man dreams.", "neutral")]
    assert [e.language for e in read_xnli_tsv(path)] == ["en", "fr", "en"]


def test_xnli_mt_training_format_maps_contradictory(tmp_path):
    path = write(tmp_path, "multinli.train.en.tsv", "premise\thypo\tlabel\nA b.\tC d.\tcontradictory\n")
    (example,) = read_xnli_tsv(path)
    assert (example.language, example.premise, example.hypothesis, example.label) == (
        None, "A b.", "C d.", "contradiction")


@pytest.mark.parametrize("bad_row, message", [
    ("A b.\tC d.", "test.tsv:3: 2 tab-separated fields, the header has 3"),
    ("A b.\tC d.\tmaybe", "test.tsv:3: unknown label 'maybe'"),
])
def test_xnli_malformed_line_names_file_and_line(tmp_path, bad_row, message):
    path = write(tmp_path, "test.tsv", f"premise\thypo\tlabel\nA.\tB.\tneutral\n{bad_row}\n")
    with pytest.raises(XmlmError, match=message):
        read_xnli_tsv(path)


def test_conll2003_with_docstart(tmp_path):
    path = write(tmp_path, "eng.train", "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n"
                                         "German JJ B-NP B-MISC\n\nPeter NNP B-NP B-PER\nBlackburn NNP B-NP I-PER\n"
                                         "\n-DOCSTART- -X- -X- O\n\nBRUSSELS NNP B-NP B-LOC\n")
    sentences = read_bio(path)
    assert [s.words for s in sentences] == [["EU", "rejects", "German"], ["Peter", "Blackburn"], ["BRUSSELS"]]
    assert [s.tags for s in sentences] == [["B-ORG", "O", "B-MISC"], ["B-PER", "I-PER"], ["B-LOC"]]


def test_wikiann_language_prefix(tmp_path):
    path = write(tmp_path, "wikiann.fr", "fr:Paris\tB-LOC\nfr:est\tO\n\nfr:Jean\tB-PER\nfr:Valjean\tI-PER\n")
    sentences = read_bio(path, token_prefix="fr:")
    assert [s.words for s in sentences] == [["Paris", "est"], ["Jean", "Valjean"]]
    bad = write(tmp_path, "mixed.fr", "fr:Paris\tB-LOC\nen:London\tB-LOC\n")
    with pytest.raises(XmlmError, match=r"mixed.fr:2: word 'en:London' lacks the prefix 'fr:'"):
        read_bio(bad, token_prefix="fr:")


@pytest.mark.parametrize("bad_line, message", [
    ("lonely", r"bad.conll:3: expected 'WORD ... TAG', got one field 'lonely'"),
    ("word NN X-PER", r"bad.conll:3: 'X-PER' is not a BIO tag"),
])
def test_bio_malformed_line_names_file_and_line(tmp_path, bad_line, message):
    path = write(tmp_path, "bad.conll", f"a NN O\n\n{bad_line}\n")
    with pytest.raises(XmlmError, match=message):
        read_bio(path)


CONLLU = """\
# sent_id = 1
# text = Je vais au marché.
1\tJe\til\tPRON\t_\t_\t2\tnsubj\t_\t_
2\tvais\taller\tVERB\t_\t_\t0\troot\t_\t_
3-4\tau\t_\t_\t_\t_\t_\t_\t_\t_
3\tà\tà\tADP\t_\t_\t5\tcase\t_\t_
4\tle\tle\tDET\t_\t_\t5\tdet\t_\t_
5\tmarché\tmarché\tNOUN\t_\t_\t2\tobl:arg\t_\tSpaceAfter=No
5.1\tallé\taller\tVERB\t_\t_\t_\t_\t2:conj\t_
6\t.\t.\tPUNCT\t_\t_\t2\tpunct\t_\t_

# sent_id = 2
1\tOui\toui\tINTJ\t_\t_\t0\troot\t_\t_
"""


def test_conllu_skips_multiword_tokens_and_empty_nodes(tmp_path):
    first, second = read_conllu(write(tmp_path, "fr.conllu", CONLLU))
    assert first.words == ["Je", "vais", "à", "le", "marché", "."]
    assert first.heads == [2, 0, 5, 5, 2, 2]
    assert first.rels == ["nsubj", "root", "case", "det", "obl:arg", "punct"]
    assert first.upos[2] == "ADP"
    assert first.comments == ["# sent_id = 1", "# text = Je vais au marché."]
    assert (second.words, second.heads, second.comments) == (["Oui"], [0], ["# sent_id = 2"])


@pytest.mark.parametrize("old, new, message", [
    ("1\tJe\til\tPRON\t_\t_\t2\tnsubj\t_\t_", "1\tJe\til\tPRON\t_\t_\t2\tnsubj", r"bad.conllu:3: 8 tab-separated"),
    ("3\tà\tà\tADP", "4\tà\tà\tADP", r"bad.conllu:6: word ID '4', expected 3"),
    ("4\tle\tle\tDET\t_\t_\t5", "4\tle\tle\tDET\t_\t_\tfive", r"bad.conllu:7: HEAD 'five' is not"),
    ("4\tle\tle\tDET\t_\t_\t5", "4\tle\tle\tDET\t_\t_\t9", r"bad.conllu:7: HEAD 9 is beyond the sentence's 6 words"),
    ("\tcase\t", "\t_\t", r"bad.conllu:6: word 3 has no DEPREL"),
])
def test_conllu_malformed_line_names_file_and_line(tmp_path, old, new, message):
    assert old in CONLLU
    path = write(tmp_path, "bad.conllu", CONLLU.replace(old, new, 1))
    with pytest.raises(XmlmError, match=message):
        read_conllu(path)


def test_missing_and_non_utf8_files(tmp_path):
    with pytest.raises(XmlmError, match="no such file"):
        read_conllu(tmp_path / "absent.conllu")
    latin1 = tmp_path / "latin1.conll"
    latin1.write_bytes("café NN O\n".encode("latin-1"))
    with pytest.raises(XmlmError, match="latin1.conll: not valid UTF-8"):
        read_bio(latin1)


def test_first_subword_index():
    pieces_of = {"Unbelievable": ["▁Un", "believ", "able"], "news": ["▁news"], "!": ["▁", "!"]}
    pieces, first = first_subword_index(["Unbelievable", "news", "!"], pieces_of.__getitem__)
    assert pieces == ["▁Un", "believ", "able", "▁news", "▁", "!"]
    assert first == [0, 3, 4]
    with pytest.raises(XmlmError, match="word 1 \\(''\\) encodes to no subword piece"):
        first_subword_index(["a", ""], lambda word: list(word))
