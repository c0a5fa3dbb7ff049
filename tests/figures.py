"""A figure as a reader sees it: the texts it draws, read back from the rendered artists after drawing.

``problems(fig)`` lists what makes a figure unreadable: math text left raw in a tick label
(``$\\mathdefault{10^{-2}}$``), a text cut at the canvas' edge, tick labels or annotations printed over one another."""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.text import Text

EDGE = 1.0  # pixels a text may touch the canvas' edge by (anti-aliasing)


def _tick_labels(fig: Figure) -> tuple[list[list[Text]], set[int]]:
    """Per axis, the tick labels drawn (ticks inside the view, with text); and every tick label's id, drawn or not."""
    drawn, every = [], set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            low, high = sorted(axis.get_view_interval())
            shown = []
            for tick in [*axis.get_major_ticks(), *axis.get_minor_ticks()]:
                for label in (tick.label1, tick.label2):
                    every.add(id(label))
                    if label.get_visible() and label.get_text() and low <= tick.get_loc() <= high:
                        shown.append(label)
            drawn.append(shown)
    return drawn, every


def drawn_texts(fig: Figure) -> list[Text]:
    """Every text the figure draws: titles, axis labels, legends, annotations and the tick labels in view."""
    fig.canvas.draw()
    ticks, every = _tick_labels(fig)
    others = [t for t in fig.findobj(Text) if id(t) not in every and t.get_visible() and t.get_text().strip()]
    return [*others, *(label for axis in ticks for label in axis)]


def tick_texts(fig: Figure) -> list[str]:
    fig.canvas.draw()
    return [label.get_text() for axis in _tick_labels(fig)[0] for label in axis]


def problems(fig: Figure) -> list[str]:
    """What a reader of the drawn figure would trip on, in words (empty: it reads)."""
    found = []
    canvas = fig.bbox
    renderer = fig.canvas.get_renderer()
    for text in drawn_texts(fig):
        box = text.get_window_extent(renderer)
        if (box.x0 < canvas.x0 - EDGE or box.y0 < canvas.y0 - EDGE or box.x1 > canvas.x1 + EDGE
                or box.y1 > canvas.y1 + EDGE):
            found.append(f"{text.get_text()!r} is cut at the canvas' edge ({box.extents} outside {canvas.extents})")
        if "\\mathdefault" in text.get_text():
            found.append(f"{text.get_text()!r}: math text printed raw")
    labels = [(text.get_text(), text.get_window_extent(renderer)) for ax in fig.axes
              for text in (ax.xaxis.label, ax.yaxis.label, ax.title) if text.get_visible() and text.get_text()]
    found += [f"axis labels {a!r} and {b!r} overprint" for i, (a, one) in enumerate(labels)
              for b, other in labels[i + 1:] if _overlap(one, other)]
    notes = [(text.get_text(), text.get_window_extent(renderer)) for ax in fig.axes for text in ax.texts
             if text.get_visible() and text.get_text()]
    found += [f"annotations {a!r} and {b!r} overprint" for i, (a, one) in enumerate(notes)
              for b, other in notes[i + 1:] if _overlap(one, other)]
    for axis in _tick_labels(fig)[0]:
        found += [f"tick label {label.get_text()!r}: math text printed raw" for label in axis
                  if len(label.get_text()) > 1 and label.get_text()[0] == label.get_text()[-1] == "$"]
        boxes = [(label.get_text(), label.get_window_extent(renderer)) for label in axis]
        found += [f"tick labels {a!r} and {b!r} overprint" for i, (a, one) in enumerate(boxes)
                  for b, other in boxes[i + 1:] if _overlap(one, other)]
    return found


def _overlap(a, b) -> bool:
    """Two extents share more than a pixel each way."""
    return min(a.x1, b.x1) - max(a.x0, b.x0) > EDGE and min(a.y1, b.y1) - max(a.y0, b.y0) > EDGE
