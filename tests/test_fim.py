"""Fill-in-the-middle without a server: the layouts, the training transformation, the prompt
preprocessing builds from a checkpoint's own sentinels, and the text postprocessing returns."""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from client.request import CompletionRequest
from contract.fim import CODEGEN2_TOKENS, NO_FIM, STARCODER_TOKENS, FimLayout
from contract.options import InvalidRequestError
from contract.words import split_word_list
from modelbuild.corpus import read_texts, split
from modelbuild.fim import IGNORE, FimTransform, middle_windows
from modelbuild.tokenizer import train_tokenizer
from postprocessing.detokenize import IncrementalDecoder, Postprocessor
from preprocessing.tokenize import Preprocessor


def request(prompts, suffixes=None, stop=b"") -> dict[str, np.ndarray]:
    n = len(prompts)
    inputs = {
        "QUERY": np.array([[p] for p in prompts], dtype=np.object_),
        "REQUEST_OUTPUT_LEN": np.full((n, 1), 8, dtype=np.uint32),
        "BAD_WORDS_DICT": np.array([[b""]] * n, dtype=np.object_),
        "STOP_WORDS_DICT": np.array([[stop]] * n, dtype=np.object_),
        # the prompt whole: these tests check tokenization (test_token_healing.py, healing)
        "token_healing": np.zeros((n, 1), dtype=np.bool_),
    }
    if suffixes is not None:
        inputs["suffix"] = np.array([[s] for s in suffixes], dtype=np.object_)
    return inputs


@pytest.fixture(scope="module")
def texts() -> list[str]:
    train, _ = split()
    return list(read_texts(train[:40]))


@pytest.fixture(scope="module")
def plain_checkpoint(tmp_path_factory, texts) -> Path:
    """A tokenizer without any FIM token (as a GPT-2 or CodeGen1 checkpoint has)."""
    path = tmp_path_factory.mktemp("plain")
    train_tokenizer(texts, 400, fim=False).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def codegen2_checkpoint(tmp_path_factory, texts) -> Path:
    """A tokenizer with CodeGen2's infill tokens added, as Salesforce's checkpoints have them."""
    path = tmp_path_factory.mktemp("codegen2")
    tokenizer = train_tokenizer(texts, 400, fim=False)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<mask_1>", "<sep>", "<eom>"]})
    tokenizer.save_pretrained(path)
    return path


# -- the layouts -------------------------------------------------------------------------------

STAR = FimLayout("starcoder", dict(zip(STARCODER_TOKENS, (1, 2, 3), strict=True)))
CG2 = FimLayout("codegen2", dict(zip(CODEGEN2_TOKENS, (5, 6, 7, 0), strict=True)))


def test_starcoder_prompt_is_psm_and_reads_back_as_prefix_then_middle():
    prompt = STAR.prompt([10, 11], [20, 21])
    assert prompt == [1, 10, 11, 2, 20, 21, 3]
    assert STAR.visible([*prompt, 30, 31]) == [10, 11, 30, 31]
    # SPM (training's other order) reads as prefix and middle too
    assert STAR.visible([1, 2, 20, 21, 3, 10, 11, 30]) == [10, 11, 30]
    # a plain sequence is unchanged, less any sentinel the model produced
    assert STAR.visible([10, 11, 3, 12]) == [10, 11, 12]


def test_starcoder_spm_puts_the_prefix_last_and_reads_back_the_same():
    spm = replace(STAR, order="spm")
    prompt = spm.prompt([10, 11], [20, 21])
    assert prompt == [1, 2, 20, 21, 3, 10, 11]
    assert spm.visible([*prompt, 30, 31]) == [10, 11, 30, 31]
    # the next keystroke's prompt starts with all of this one's (a prefix cache reuses it)
    assert spm.prompt([10, 11, 12], [20, 21])[: len(prompt)] == prompt
    with pytest.raises(ValueError, match="the codegen2 layout has no such prompt order"):
        replace(CG2, order="spm")


def test_codegen2_prompt_follows_its_model_card_and_hides_its_sentinels():
    prompt = CG2.prompt([10, 11], [20])
    assert prompt == [10, 11, 5, 20, 0, 6, 5]  # P <mask_1> S <|endoftext|> <sep> <mask_1>
    assert CG2.visible([*prompt, 30, 31, 7]) == [10, 11, 30, 31]  # <eom> never shown
    assert CG2.stop == [7] and STAR.stop is None
    assert CG2.visible([10, 0, 11]) == [10, 0, 11]  # the end token is the tokenizer's to skip


# -- the training transformation ---------------------------------------------------------------


def test_fim_windows_keep_their_length_and_hold_every_token_of_the_piece(tiny_checkpoint):
    pre = Preprocessor(tiny_checkpoint)
    tokenizer = pre.tokenizer
    eos = tokenizer.eos_token_id
    first = pre.encode("def add(a, b):\n    return a + b\n\n\nclass Stack:\n    pass\n")
    second = pre.encode("x = 1\ny = 2\nz = 3\nprint(x, y, z)\n")
    window = np.array([*first, eos, *second])
    sentinels = tokenizer.convert_tokens_to_ids(list(STARCODER_TOKENS))
    always = FimTransform(tokenizer, rate=1.0, spm_rate=0.5, rng=random.Random(0))
    originals = [tokenizer.decode(first), tokenizer.decode(second)]
    orders = set()
    for _ in range(20):
        tokens, labels = always.window(window)
        assert tokens.shape == labels.shape == window.shape
        pieces = [p for p in tokenizer.decode(tokens.tolist()).split("<|endoftext|>") if p]
        made = 0
        for piece, original in zip(pieces, originals, strict=True):
            if piece == original:  # its suffix was too short to make room for the sentinels
                continue
            # a FIM example, ended by its own end token
            assert piece.startswith("<fim_prefix>") and piece.count("<fim_middle>") == 1
            orders.add(piece.startswith("<fim_prefix><fim_suffix>"))
            made += 1
        # labels are the tokens, except padding, which carries no loss
        kept = labels != IGNORE
        assert (tokens[kept] == labels[kept]).all() and (tokens[~kept] == eos).all()
        assert sum(int(t in sentinels) for t in tokens.tolist()) == 3 * made
    assert orders == {True, False}  # both PSM and SPM
    never = FimTransform(tokenizer, rate=0.0, spm_rate=0.5, rng=random.Random(0))
    tokens, labels = never.window(window)
    assert tokens.tolist() == labels.tolist() == window.tolist()


def test_a_fim_example_holds_the_whole_text_in_prefix_middle_suffix(tiny_checkpoint):
    tokenizer = Preprocessor(tiny_checkpoint).tokenizer
    text = "def area(r):\n    return 3.14159 * r * r\n\n\nprint(area(2.0))\n" * 3
    piece = tokenizer(text, add_special_tokens=False)["input_ids"]
    made = 0
    for seed in range(10):
        transform = FimTransform(tokenizer, rate=1.0, spm_rate=0.0, rng=random.Random(seed))
        tokens, _ = transform.piece(piece)
        assert len(tokens) == len(piece)
        if tokens == piece:  # the suffix could not make room for the sentinels
            continue
        made += 1
        decoded = tokenizer.decode(tokens)
        prefix, rest = decoded.removeprefix("<fim_prefix>").split("<fim_suffix>")
        suffix, middle = rest.split("<fim_middle>")
        middle = middle.split("<|endoftext|>")[0]
        # the suffix lost its last tokens to the sentinels; the rest is the text, in order
        assert text.startswith(prefix + middle + suffix)
        assert len(prefix + middle + suffix) > len(text) - 40
    assert made >= 5


def test_held_out_middle_windows_score_only_the_middle(tiny_checkpoint):
    pre = Preprocessor(tiny_checkpoint)
    _, valid = split()
    data = np.array(pre.encode("".join(read_texts(valid))[:20_000]))
    windows = middle_windows(pre.tokenizer, data, 128, 4, seed=1)
    middle = pre.tokenizer.convert_tokens_to_ids("<fim_middle>")
    assert windows
    for tokens, labels in windows:
        scored = np.flatnonzero(labels != IGNORE)
        assert scored[0] == tokens.tolist().index(middle) + 1  # from the first middle token
        assert labels[scored[-1]] == pre.tokenizer.eos_token_id  # to the end token after it


def test_a_prompt_cut_at_a_line_start_or_its_indentation_tokenizes_as_the_whole_file(
    tiny_checkpoint,
):
    """The cursor's usual places: what precedes them is a run of the file's own tokens, so the
    model saw that ending in training (GPT-2's rule would merge the newline and indentation
    with the next word, an ending the model seldom saw)."""
    pre = Preprocessor(tiny_checkpoint)
    text = "class Stack:\n    def push(self, item):\n\n        self.items.append(item)\n"
    whole = pre.encode(text)
    cuts = [i + 1 for i, c in enumerate(text) if c == "\n"]  # line starts
    cuts += [i for i in range(1, len(text)) if text[i - 1] == " " and text[i] not in " \n"]
    for cut in cuts:
        if text[:cut].endswith((" ", "\n")) and text[:cut].strip(" ").endswith("\n"):
            part = pre.encode(text[:cut])
            assert whole[: len(part)] == part, repr(text[:cut])
    assert [pre.tokenizer.decode([t]) for t in pre.encode("\n        x")] == ["\n", "        ", "x"]


# -- preprocessing and postprocessing ----------------------------------------------------------


def test_the_default_tokenizer_has_the_starcoder_sentinels(tiny_checkpoint):
    pre = Preprocessor(tiny_checkpoint)
    assert pre.fim is not None and pre.fim.style == "starcoder"
    assert set(pre.tokenizer.all_special_tokens) == {"<|endoftext|>", *STARCODER_TOKENS}


def test_the_fim_order_is_the_builds_unless_the_deployment_says(tiny_checkpoint, tmp_path):
    # auto (the default): the order `make model` wrote into build.json, SPM for the default model
    assert json.loads((tiny_checkpoint / "build.json").read_text())["build"]["fim_order"] == "spm"
    assert Preprocessor(tiny_checkpoint).fim.order == "spm"
    assert Preprocessor(tiny_checkpoint, fim_order="psm").fim.order == "psm"
    # a checkpoint `make model` did not build (no build.json) gets PSM
    other = tmp_path / "imported"
    shutil.copytree(tiny_checkpoint, other)
    (other / "build.json").unlink()
    assert Preprocessor(other).fim.order == "psm"
    pre = Preprocessor(tiny_checkpoint)
    sentinels = [pre.tokenizer.convert_tokens_to_ids(t) for t in STARCODER_TOKENS]
    out = pre.tensors(request([b"def f(x):\n    "], [b"\n    return y\n"]))
    expected = [
        sentinels[0],
        sentinels[1],
        *pre.encode("\n    return y\n"),
        sentinels[2],
        *pre.encode("def f(x):\n    "),
    ]
    assert out["INPUT_ID"][0, : len(expected)].tolist() == expected
    with pytest.raises(ValueError, match="fim_order 'middle'"):
        Preprocessor(tiny_checkpoint, fim_order="middle")


def test_suffix_builds_the_fim_prompt_and_an_empty_one_does_not(tiny_checkpoint):
    pre = Preprocessor(tiny_checkpoint, fim_order="psm")
    sentinels = [pre.tokenizer.convert_tokens_to_ids(t) for t in STARCODER_TOKENS]
    out = pre.tensors(request([b"def f(x):\n    ", b"import os"], [b"\n    return y\n", b""]))
    fim = pre.encode("def f(x):\n    ")
    expected = [sentinels[0], *fim, sentinels[1], *pre.encode("\n    return y\n"), sentinels[2]]
    assert out["REQUEST_INPUT_LEN"][:, 0].tolist() == [len(expected), len(pre.encode("import os"))]
    assert out["INPUT_ID"][0, : len(expected)].tolist() == expected
    assert out["INPUT_ID"][1, : len(pre.encode("import os"))].tolist() == pre.encode("import os")
    # without the input, or with it empty, the prompt is the one an old client gets
    plain = pre.tensors(request([b"import os"]))
    np.testing.assert_array_equal(
        pre.tensors(request([b"import os"], [b""]))["INPUT_ID"], plain["INPUT_ID"]
    )


def test_fim_allows_an_empty_prefix_but_not_nothing_at_all(tiny_checkpoint):
    pre = Preprocessor(tiny_checkpoint)
    out = pre.tensors(request([b""], [b"return x\n"]))
    assert out["REQUEST_INPUT_LEN"][0, 0] == len(pre.encode("return x\n")) + 3
    with pytest.raises(InvalidRequestError, match="INPUT_0 row 0 is an empty prompt"):
        pre.tensors(request([b""], [b""]))
    with pytest.raises(InvalidRequestError, match="suffix has 1 rows for 2 prompts"):
        pre.tensors(request([b"a", b"b"], [b"c"]))
    with pytest.raises(InvalidRequestError, match="suffix of row 0 is not valid UTF-8"):
        pre.tensors(request([b"a"], [b"\xff"]))


def test_a_checkpoint_without_fim_tokens_refuses_suffix_by_name(plain_checkpoint):
    pre = Preprocessor(plain_checkpoint)
    assert pre.fim is None
    with pytest.raises(InvalidRequestError) as refused:
        pre.tensors(request([b"def f():"], [b"    return 1"]))
    assert str(refused.value) == NO_FIM and "`suffix`" in NO_FIM
    assert pre.tensors(request([b"def f():"], [b""]))["INPUT_ID"].size  # empty: no FIM asked
    assert Postprocessor(plain_checkpoint).fim is None


def test_codegen2_checkpoints_get_their_layout_and_stop_at_end_of_mask(codegen2_checkpoint):
    pre = Preprocessor(codegen2_checkpoint)
    assert pre.fim is not None and pre.fim.style == "codegen2"
    ids = {t: pre.tokenizer.convert_tokens_to_ids(t) for t in CODEGEN2_TOKENS}
    out = pre.tensors(request([b"def f():\n", b"x"], [b"    return 1\n", b""], stop=b"\n\n"))
    prefix, suffix = pre.encode("def f():\n"), pre.encode("    return 1\n")
    expected = [*prefix, ids["<mask_1>"], *suffix, ids["<|endoftext|>"], ids["<sep>"]]
    expected.append(ids["<mask_1>"])
    assert out["INPUT_ID"][0, : len(expected)].tolist() == expected
    stops = [split_word_list(row) for row in out["STOP_WORDS_IDS"]]
    assert stops[0] == [pre.encode("\n\n"), [ids["<eom>"]]]  # the user's words, then <eom>
    assert stops[1] == [pre.encode("\n\n")]  # a plain row does not stop at <eom>
    post = Postprocessor(codegen2_checkpoint)
    middle = pre.encode("    x = 2\n")
    tokens = np.array([[[*expected, *middle, ids["<eom>"]]]], dtype=np.uint32)
    assert post.batch(tokens, None)[0].decode() == "def f():\n    x = 2\n"


def test_postprocessing_returns_prefix_and_middle_and_never_a_sentinel(tiny_checkpoint):
    pre, post = Preprocessor(tiny_checkpoint), Postprocessor(tiny_checkpoint)
    prompt = pre.tensors(request([b"def f(x):\n    ", b"a = "], [b"\n    return y\n", b""]))
    middle = pre.encode("y = x + 1")
    sentinel = pre.tokenizer.convert_tokens_to_ids("<fim_suffix>")
    tokens = np.zeros((2, 1, 64), dtype=np.uint32)
    lengths = np.zeros((2, 1), dtype=np.uint32)
    for row in range(2):
        n = int(prompt["REQUEST_INPUT_LEN"][row, 0])
        generated = [*middle, sentinel] if row == 0 else [sentinel, *middle]
        sequence = [*prompt["INPUT_ID"][row, :n].tolist(), *generated]
        tokens[row, 0, : len(sequence)] = sequence
        lengths[row, 0] = len(sequence)
    texts = [t.decode() for t in post.batch(tokens, lengths)]
    assert texts == ["def f(x):\n    y = x + 1", "a = y = x + 1"]
    # streamed: the pieces are the middle alone, without the sentinel the model produced
    n = int(prompt["REQUEST_INPUT_LEN"][0, 0])
    decoder = IncrementalDecoder(post, prompt["INPUT_ID"][0, :n].tolist())
    pieces = [decoder.push(t) for t in [*middle, sentinel]]
    assert "".join(pieces) + decoder.flush() == "y = x + 1"


# -- the client's request ----------------------------------------------------------------------


def test_the_client_sends_suffix_only_when_there_is_one():
    assert "suffix" not in CompletionRequest("def f():").tensors()
    assert "suffix" not in CompletionRequest("def f():", suffix="").tensors()
    tensors = CompletionRequest(("a", ""), suffix=("", "b")).tensors()
    assert tensors["suffix"].tolist() == [[b""], [b"b"]]
    with pytest.raises(InvalidRequestError, match="1 suffixes for 2 prompts"):
        CompletionRequest(("a", "b"), suffix="c")
    with pytest.raises(InvalidRequestError, match="prompt 0 is empty"):
        CompletionRequest("", suffix="")


def test_the_infill_benchmark_masks_whole_lines_of_held_out_files():
    from modelbuild.infill import MIN_CHARS, masked_lines

    _, held_out = split()
    texts = set(read_texts(held_out))
    cases = masked_lines(25, seed=1)
    assert len(cases) == 25 and cases == masked_lines(25, seed=1)
    for prefix, line, suffix in cases:
        assert prefix + line + "\n" + suffix in texts  # the file, cut around one line
        assert prefix == "" or prefix.endswith("\n")
        assert "\n" not in line and len(line.strip()) >= MIN_CHARS


def test_fim_cost_compares_with_the_twin_built_without_fim(tmp_path):
    import json
    from dataclasses import asdict, replace

    from modelbuild.fim_cost import main as fim_cost
    from modelbuild.train import BuildConfig

    def write(path: Path, config: BuildConfig, ltr: float, middle: float) -> None:
        path.mkdir()
        facts = {"held_out_loss": ltr, "held_out_middle_loss": middle, "build": asdict(config)}
        facts["held_out_curve"] = [[62, ltr + 1], [250, ltr]]
        (path / "build.json").write_text(json.dumps(facts))
        (path / "MODEL_CARD.md").write_text("# card\n")

    config = BuildConfig(bf16=False)
    write(tmp_path / "fim", config, 4.2, 3.1)
    write(tmp_path / "plain", replace(config, fim_rate=0.0), 4.1, 5.0)  # the twin, already built
    fim_cost(["--checkpoint", str(tmp_path / "fim"), "--baseline", str(tmp_path / "plain")])
    card = (tmp_path / "fim" / "MODEL_CARD.md").read_text()
    assert card.startswith("# card\n\n## What fill-in-the-middle costs")
    assert "| 0 | 4.100 | 5.000 |" in card and "| 0.5 | 4.200 | 3.100 |" in card
    assert "FIM costs +0.100 nats/token" in card
    assert "| 62 | 5.100 | 5.200 | +0.100 |" in card
    # run again: the section is replaced, not added twice
    fim_cost(["--checkpoint", str(tmp_path / "fim"), "--baseline", str(tmp_path / "plain")])
    assert (tmp_path / "fim" / "MODEL_CARD.md").read_text().count("## What fill") == 1
