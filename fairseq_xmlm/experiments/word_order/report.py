"""Table 4 on the Bible: DIR/table4.md, its JSON source DIR/dufter_table4.json and the figure DIR/table4.png.

dufter_table4.json = {"model": str, "languages": {label: {"kendall_tau": float, "zero_shot": float}},
"pearson": float, "paper": {...}}: zero_shot is the genre test accuracy as a fraction, null where it is not
measured (no zero-shot results, or a Bible the multilingual model was not trained on: another version of a
language); pearson the correlation of the two columns over the languages other than English that have both (the
paper's 46 %; null for fewer than three such languages or a constant column). "paper" compares the Kendall's tau
column with the paper's mBERT values over the languages both tables hold (Pearson's r), a separate question.
"""
from pathlib import Path

import numpy as np

from fairseq_xmlm.data import bible_verses
from fairseq_xmlm.experiments.word_order.runs import ENGLISH, PAPER_PEARSON, PAPER_TABLE4
from fairseq_xmlm.io import write_atomic, write_json
from fairseq_xmlm.plotting import pyplot, save_png


def pearson(xs, ys):
    """Pearson's r of two equally long sequences; None for fewer than three points or a constant column."""
    xs, ys = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    if len(xs) < 3 or np.ptp(xs) == 0 or np.ptp(ys) == 0:
        return None
    return float(np.corrcoef(xs, ys)[0, 1])


def paper_comparison(languages):
    """Pearson's r of our Kendall's tau and the paper's over the languages both tables hold (plain language labels;
    other versions of a language are left out)."""
    shared = [label for label in languages if label in PAPER_TABLE4 and label != ENGLISH]
    r = pearson([languages[label]["kendall_tau"] for label in shared], [PAPER_TABLE4[label][0] for label in shared])
    return {"languages": shared, "pearson_kendall_tau": r}


def summarize(model, word_order, zero_shot=None):
    """The dufter_table4.json document; zero_shot: read_genre_results' dict or None."""
    accuracy = zero_shot["accuracy"] if zero_shot else {}
    languages = {label: {"kendall_tau": result["kendall_tau"], "zero_shot": accuracy.get(label)}
                 for label, result in word_order.items()}
    both = [v for v in languages.values() if v["zero_shot"] is not None]
    r = pearson([v["kendall_tau"] for v in both], [v["zero_shot"] for v in both])
    return {"model": model, "languages": languages, "pearson": r, "paper": paper_comparison(languages)}


def pearson_with_english(summary, zero_shot):
    """The paper's second number: English added as (Kendall's tau 1, its in-language accuracy)."""
    if zero_shot is None or ENGLISH not in zero_shot["accuracy"] or summary["pearson"] is None:
        return None
    values = [(v["kendall_tau"], v["zero_shot"]) for v in summary["languages"].values() if v["zero_shot"] is not None]
    values.append((1.0, zero_shot["accuracy"][ENGLISH]))
    return pearson(*zip(*values))


def _number(value, scale=1, digits=2):
    return "-" if value is None else f"{value * scale:.{digits}f}"


VECTOR_NOTES = {
    "verse_ids": "verse-ID vectors (the Dice coefficient of the sets of parallel verses two words occur in, Levy "
                 "et al. 2017)",
    "fasttext": "fastText vectors ({fasttext_dim} dims, {fasttext_epochs} epochs) mapped into English space by the "
                "unsupervised mapping (cosine)",
}


def table_markdown(summary, word_order, settings, zero_shot=None):
    english = f"{settings['english']} ({bible_verses.VERSIONS[settings['english_version']][1]})"
    note = (f"Kendall's tau (Birch & Osborne: 1 - sqrt(discordant pairs / all pairs); 1 = English word order) of "
            f"Match alignments between {english} and each Bible, mean over up to {settings['verses']} verses of "
            f"the genre benchmark's test books (books: {settings['books']}); word similarities from "
            f"{VECTOR_NOTES[settings['vectors']].format(**settings)}. chance: the same metric's mean for random "
            "alignments of the same verses. ")
    columns = ["language", "Bible", "Kendall's tau", "chance", "verses", "paper tau", "paper XNLI"]
    if zero_shot:
        note += (f"zero-shot: genre test accuracy (%) of the model `{summary['model']}` fine-tuned on English, "
                 "majority-class baseline in brackets. ")
        columns.insert(5, "zero-shot (majority)")
    note += "Paper: mBERT + Match on 2500 XNLI dev sentences, and its XNLI accuracy (%)."
    lines = ["# Table 4 (Dufter & Schütze 2020) on the Bible: word order and zero-shot transfer", "", note, "",
             "| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
    for label, entry in summary["languages"].items():
        result = word_order[label]
        paper = PAPER_TABLE4.get(label) or (None, None)
        cells = [label, result["version"], f"{result['kendall_tau']:.3f}", f"{result['chance']:.3f}",
                 str(result["verses"])]
        if zero_shot:
            majority = zero_shot["majority"].get(label)
            cells.append(_number(entry["zero_shot"], 100, 1) + (f" ({majority * 100:.1f})" if majority is not None
                                                                else ""))
        cells += [_number(paper[0]), _number(paper[1], digits=1)]
        lines.append("| " + " | ".join(cells) + " |")
    comparison = summary["paper"]
    lines += ["", f"Pearson's r of this Kendall's tau and the paper's over the {len(comparison['languages'])} "
                  f"languages both tables hold ({', '.join(comparison['languages'])}): "
                  f"{_number(comparison['pearson_kendall_tau'])}."]
    if zero_shot:
        measured = sum(v["zero_shot"] is not None for v in summary["languages"].values())
        lines += ["", f"Pearson's r of Kendall's tau and zero-shot accuracy over the {measured} "
                      f"languages: {_number(summary['pearson'])} without English, "
                      f"{_number(pearson_with_english(summary, zero_shot))} with English (tau 1, in-language "
                      f"accuracy); the paper: {PAPER_PEARSON['without English']:.2f} and "
                      f"{PAPER_PEARSON['with English']:.2f}."]
    return "\n".join(lines) + "\n"


def figure(summary, word_order):
    """Zero-shot accuracy against Kendall's tau (one labelled point per language); without zero-shot results,
    each language's Kendall's tau beside its chance level."""
    plt = pyplot()
    fig, axis = plt.subplots(figsize=(6.4, 4.8))
    labels = list(summary["languages"])
    taus = [summary["languages"][label]["kendall_tau"] for label in labels]
    measured = [k for k, label in enumerate(labels) if summary["languages"][label]["zero_shot"] is not None]
    if measured:
        labels, taus = [labels[k] for k in measured], [taus[k] for k in measured]
        accuracies = [summary["languages"][label]["zero_shot"] * 100 for label in labels]
        axis.scatter(taus, accuracies)
        for label, x, y in zip(labels, taus, accuracies):
            axis.annotate(label, (x, y), textcoords="offset points", xytext=(3, 3), fontsize=8)
        axis.set_xlabel("Kendall's tau against English word order")
        axis.set_ylabel("zero-shot genre accuracy (%)")
        axis.set_title(f"{summary['model']}: Pearson r = {_number(summary['pearson'])}", fontsize=9)
    else:
        order = np.argsort(taus)
        axis.scatter([taus[k] for k in order], range(len(labels)), label="Kendall's tau")
        axis.scatter([word_order[labels[k]]["chance"] for k in order], range(len(labels)), marker="|", s=120,
                     color="grey", label="chance (random alignments)")
        axis.set_yticks(range(len(labels)), [labels[k] for k in order], fontsize=8)
        axis.set_xlabel("Kendall's tau against English word order")
        axis.legend(fontsize=8)
    return fig


def write_report(out_dir, model, word_order, settings, zero_shot=None):
    """DIR/dufter_table4.json, DIR/table4.md and DIR/table4.png; returns the summary."""
    out_dir = Path(out_dir)
    summary = summarize(model, word_order, zero_shot)
    write_json(out_dir / "dufter_table4.json", summary)
    write_atomic(out_dir / "table4.md", table_markdown(summary, word_order, settings, zero_shot))
    save_png(figure(summary, word_order), out_dir / "table4.png")
    return summary
