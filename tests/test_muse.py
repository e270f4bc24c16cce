"""The one MUSE dictionary reader (xmlm-eval-mult --dict, xmlm-analyze word, the code-switching dictionary) and
writer (xmlm-fetch-dict)."""
import os
import stat

import pytest

from fairseq_xmlm.data.muse import load_muse_dictionary, write_muse
from fairseq_xmlm.errors import XmlmError


def test_pairs_and_weights(tmp_path):
    path = tmp_path / "d.txt"
    path.write_text("dog chien 0.7\ndog toutou 0.3\ncat chat\n\n")
    assert load_muse_dictionary(path) == [("dog", "chien"), ("dog", "toutou"), ("cat", "chat")]
    assert load_muse_dictionary(path, with_weights=True) == [("dog", "chien", 0.7), ("dog", "toutou", 0.3),
                                                              ("cat", "chat", 1.0)]


@pytest.mark.parametrize("content, message", [
    (None, "dictionary {path} does not exist"),
    (b"", "empty: {path}"),
    (b"\n  \n", "empty: {path}"),
    ("chien dog\nch\u00e8vre goat\n".encode("latin-1"), "{path}: invalid UTF-8 on line 2"),
    (b"dog chien\nthree words here too\n", "{path}: line 2 is not `src tgt [weight]`"),
    (b"dog\n", "{path}: line 1 is not `src tgt [weight]`"),
])
def test_bad_files_are_named_in_one_error(tmp_path, content, message):
    path = tmp_path / "d.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(XmlmError) as error:
        load_muse_dictionary(path)
    assert message.format(path=path) in str(error.value)


def test_a_bad_weight_is_refused_only_where_weights_are_read(tmp_path):
    path = tmp_path / "d.txt"
    path.write_text("dog chien heavy\n")
    assert load_muse_dictionary(path) == [("dog", "chien")]
    with pytest.raises(XmlmError, match="line 1 has a non-numeric weight 'heavy'"):
        load_muse_dictionary(path, with_weights=True)


def test_written_files_read_back_with_the_umask_permissions(tmp_path):
    umask = os.umask(0o022)
    try:
        write_muse(tmp_path / "out" / "d.txt", [("dog", "chien"), ("cat", "chat")])
    finally:
        os.umask(umask)
    assert load_muse_dictionary(tmp_path / "out" / "d.txt") == [("dog", "chien"), ("cat", "chat")]
    assert stat.S_IMODE((tmp_path / "out" / "d.txt").stat().st_mode) == 0o644
    assert os.listdir(tmp_path / "out") == ["d.txt"]
