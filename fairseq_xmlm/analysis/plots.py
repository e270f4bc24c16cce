"""xmlm-analyze's figures: retrieval per layer, word translation per layer, and a CKA heatmap like Conneau et
al. 2020's Figure 7."""
import numpy as np

from fairseq_xmlm.plotting import pyplot, save_png


def plot_retrieval(per_layer, title, path):
    figure, axis = pyplot().subplots(figsize=(5, 3.2))
    layers = range(len(per_layer))
    for key, label in (("a_to_b", "A -> B"), ("b_to_a", "B -> A")):
        axis.plot(layers, [100 * r[key] for r in per_layer], marker="o", label=label)
    axis.set(xlabel="layer", ylabel="P@1 (%)", title=title, xticks=list(layers))
    axis.legend()
    save_png(figure, path)


def plot_word(result, path):
    figure, axis = pyplot().subplots(figsize=(5, 3.2))
    layers = range(len(result["contextual"]))
    axis.plot(layers, [100 * r["p1"] for r in result["contextual"]], marker="o", label="contextual")
    axis.axhline(100 * result["noncontextual"]["p1"], color="C1", linestyle="--", label="embeddings (1 piece)")
    axis.axhline(100 * result["fasttext"]["p1"], color="C2", linestyle=":", label="fastText")
    axis.set(xlabel="layer", ylabel="P@1 (%)", title="Word translation after Procrustes (CSLS)",
             xticks=list(layers))
    axis.legend()
    save_png(figure, path)


def plot_cka_heatmap(rows, labels, title, path):
    values = np.array([row + [float(np.mean(row))] for row in rows])
    figure, axis = pyplot().subplots(figsize=(1.0 + 0.6 * values.shape[1], 0.8 + 0.5 * len(rows)))
    axis.imshow(values, cmap="viridis", vmin=0, vmax=1, aspect="auto")
    axis.set_xticks(range(values.shape[1]), [f"L{i}" for i in range(values.shape[1] - 1)] + ["avg"])
    axis.set_yticks(range(len(labels)), labels)
    for (r, c), v in np.ndenumerate(values):
        axis.text(c, r, f"{v:.2f}", ha="center", va="center", color="white" if v < 0.6 else "black", fontsize=8)
    axis.set_title(title)
    save_png(figure, path)
