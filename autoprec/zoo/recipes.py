"""Sample-data recipes for zoo models: real images, rendered text, real files, real sentences.

Each recipe returns arrays named like the model's inputs, preprocessed the way the model's own
package does it, stacked along a leading item axis (what ``--data x.npz`` takes).
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from autoprec.analysis.images import letterboxed

DEJAVU = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")

SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Quantization maps floating-point values to a small set of integers.",
    "Reduced precision makes inference faster, but not every layer tolerates it.",
    "A Pareto front shows the trade-off between latency and accuracy.",
    "The weather in the mountains changed quickly that afternoon.",
    "She read the report twice before sending it to the team.",
    "Graph rewrites insert quantize and dequantize nodes around each layer.",
    "Calibration records the range of every activation tensor.",
    "Our train leaves at seven, so we should pack tonight.",
    "Half precision overflows above sixty-five thousand five hundred.",
    "The museum opens a new exhibition of modern sculpture next week.",
    "Measure, do not guess: every candidate is built and timed.",
    "He planted tomatoes, beans and basil in the small garden.",
    "An engine profile shows which layers dominate the latency.",
    "Optical character recognition reads text from scanned pages.",
    "The committee postponed its decision until the spring meeting.",
)


def _image(data: bytes, mode: str = "RGB") -> Image.Image:
    return Image.open(io.BytesIO(data)).convert(mode)


def _normalise(rgb: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """HWC uint8 -> CHW float32, (x/255 - mean) / std per channel."""
    x = rgb.astype(np.float32) / 255.0
    return ((x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)).transpose(2, 0, 1)


def ppocr_det(images: Mapping[str, bytes], size: int = 640) -> dict[str, np.ndarray]:
    """Document and text photos (and their halves), resized to size×size, PaddleOCR det
    normalisation."""
    pages = [_image(images[n]) for n in ("page.png", "text.png")]
    crops = []
    for page in pages:
        w, h = page.size
        crops += [page, page.crop((0, 0, w // 2, h)), page.crop((w // 2, 0, w, h)),
                  page.crop((0, 0, w, h // 2))]
    x = [_normalise(np.asarray(c.resize((size, size), Image.BILINEAR)), (0.485, 0.456, 0.406),
                    (0.229, 0.224, 0.225))
         for c in crops]
    return {"x": np.stack(x)}


def _text_line_tensor(line: Image.Image, height: int, width: int) -> np.ndarray:
    """PaddleOCR rec/cls preprocessing: resize to the height keeping the ratio, pad right,
    (x/255-0.5)/0.5."""
    w = min(width, max(1, int(round(line.width * height / line.height))))
    resized = np.asarray(line.convert("RGB").resize((w, height), Image.BILINEAR), np.float32)
    padded = np.zeros((height, width, 3), np.float32)
    padded[:, :w] = (resized / 255.0 - 0.5) / 0.5
    return padded.transpose(2, 0, 1)


def _font(size: int) -> ImageFont.FreeTypeFont:
    if DEJAVU.exists():
        return ImageFont.truetype(str(DEJAVU), size)
    # Pillow's own scalable font: keeps the recipe working where Debian's fonts-dejavu-core is
    # missing.
    return ImageFont.load_default(size=size)


def ppocr_rec(height: int = 48, width: int = 320) -> dict[str, np.ndarray]:
    """Sentences rendered as text lines (DejaVu Sans), light and dark backgrounds, with their true
    text: as many words as fit the recognizer's 320×48 window unsqueezed (PaddleOCR cuts longer
    lines too)."""
    lines, texts = [], []
    for i, sentence in enumerate(SENTENCES):
        font = _font(28 + (i % 3) * 4)
        words = sentence.split()
        text = words[0]
        for word in words[1:]:
            left, top, right, bottom = font.getbbox(f"{text} {word}")
            if (right - left + 16) / (bottom - top + 12) > width / height:
                break
            text = f"{text} {word}"
        left, top, right, bottom = font.getbbox(text)
        background, ink = ((250, 250, 245), (20, 20, 20)) if i % 4 else ((40, 40, 60), (235, 235, 235))
        img = Image.new("RGB", (right - left + 16, bottom - top + 12), background)
        ImageDraw.Draw(img).text((8 - left, 6 - top), text, font=font, fill=ink)
        lines.append(_text_line_tensor(img, height, width))
        texts.append(text)
    return {"x": np.stack(lines), "text": np.asarray(texts)}


def text_line_crops(page_png: bytes, height: int = 48, width: int = 192) -> tuple[np.ndarray, np.ndarray]:
    """Windows cut from a scanned page's text lines, upright (label 0) and rotated 180° (label
    1)."""
    page = _image(page_png, "L")
    g = np.asarray(page).astype(np.float32)
    # Ink is darker than the local background (the page is unevenly lit): compare with a max filter.
    background = np.maximum.reduce([np.roll(g, s, axis=1) for s in range(-8, 9)])
    rows = ((background - g) > 40).sum(axis=1) > 0.1 * g.shape[1]
    lines, start = [], None
    for y, on in enumerate(rows):
        if on and start is None:
            start = y
        elif not on and start is not None:
            if y - start >= 8:
                lines.append((max(0, start - 2), min(len(rows), y + 2)))
            start = None
    crops = []
    for top, bottom in lines:
        window = 4 * (bottom - top)
        for left in range(0, g.shape[1] - window + 1, window):
            crops.append(page.crop((left, top, left + window, bottom)))
    upright = [_text_line_tensor(c, height, width) for c in crops]
    flipped = [_text_line_tensor(c.rotate(180), height, width) for c in crops]
    label = np.array([0] * len(upright) + [1] * len(flipped), np.int64)
    return np.stack(upright + flipped), label


def ppocr_cls(images: Mapping[str, bytes]) -> dict[str, np.ndarray]:
    """Text-line crops and their orientation (the classifier's classes: 0 upright, 1 rotated
    180°)."""
    x, labels = text_line_crops(images["page.png"])
    return {"x": x, "labels": labels}


def yolov8(images: Mapping[str, bytes], size: int = 320) -> dict[str, np.ndarray]:
    """Photos letterboxed to size×size on grey (114), RGB, x/255: Ultralytics' preprocessing."""
    out = []
    for name in ("astronaut.png", "coffee.png", "chelsea.png", "rocket.jpg", "motorcycle_left.png",
                 "camera.png"):
        canvas = letterboxed(_image(images[name]), size, size)  # as --image-resize letterbox
        out.append(np.asarray(canvas, np.float32).transpose(2, 0, 1) / 255.0)
    return {"images": np.stack(out)}


def magika_features(content: bytes, beg_size: int, end_size: int, padding: int) -> np.ndarray:
    """Magika v3 features: the first and last bytes after stripping whitespace, padded with
    ``padding``."""
    stripped = content.strip()
    beg = list(stripped[:beg_size]) + [padding] * max(0, beg_size - len(stripped))
    end_part = stripped[-end_size:] if end_size else b""
    end = [padding] * max(0, end_size - len(end_part)) + list(end_part)
    return np.asarray(beg[:beg_size] + end, np.int32)


# A file's true type, as magika names it, from its name (or magic bytes); files whose type a name
# does not settle (METADATA, WHEEL: key-value text some call markdown) stay unlabelled.
MAGIKA_TYPES = {".py": "python", ".json": "json", ".md": "markdown", ".onnx": "onnx",
                "RECORD": "csv"}


def magika_true_type(name: str, content: bytes) -> str | None:
    if content.startswith(b"\x7fELF"):
        return "elf"
    return MAGIKA_TYPES.get(Path(name).suffix) or MAGIKA_TYPES.get(Path(name).name)


def magika(wheel: Path, config: Mapping, count: int = 32) -> dict[str, np.ndarray]:
    """Real files of many types: every file inside the pinned magika wheel (code, JSON, Markdown,
    the ONNX model, ...), labelled with their true type's index in the model's label space (-1: not
    settled)."""
    with zipfile.ZipFile(wheel) as zf:
        names = sorted(n for n in zf.namelist() if not n.endswith("/") and zf.getinfo(n).file_size >= 16)
        step = max(1, len(names) // count)
        chosen = names[::step][:count]
        files = [zf.read(n) for n in chosen]
    rows = [magika_features(f, config["beg_size"], config["end_size"], config["padding_token"]) for f in files]
    space = list(config["target_labels_space"])
    types = [magika_true_type(n, f) for n, f in zip(chosen, files)]
    labels = [space.index(t) if t in space else -1 for t in types]
    return {"bytes": np.stack(rows), "labels": np.asarray(labels, np.int64)}


def sentences(tokenizer_json: Path, length: int) -> dict[str, np.ndarray]:
    """Real sentences, tokenized with the model's own tokenizer.json, padded or cut to
    ``length``."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    tokenizer.enable_truncation(max_length=length)
    tokenizer.enable_padding(length=length)
    encoded = tokenizer.encode_batch(list(SENTENCES))
    return {
        "input_ids": np.asarray([e.ids for e in encoded], np.int64),
        "attention_mask": np.asarray([e.attention_mask for e in encoded], np.int64),
    }



def speech(espeak: Path, texts: Sequence[str], rate: int = 16000, pause: float = 0.3) -> np.ndarray:
    """English speech synthesized offline by eSpeak NG (the espeakng-loader wheel's library and
    data, unpacked in ``espeak``), a pause of silence after each text, resampled to ``rate``:
    float32 in [-1, 1]."""
    import ctypes

    package = espeak / "espeakng_loader"
    lib = ctypes.CDLL(str(package / "libespeak-ng.so"))
    lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    synchronous = 2  # AUDIO_OUTPUT_SYNCHRONOUS: samples come to the callback, nothing is played
    native = lib.espeak_Initialize(synchronous, 500, str(package / "espeak-ng-data").encode(), 0)
    if native <= 0 or lib.espeak_SetVoiceByName(b"en") != 0:
        raise RuntimeError(f"eSpeak NG from {package} did not start (rate {native})")
    pieces: list[np.ndarray] = []
    callback_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int,
                                     ctypes.c_void_p)

    @callback_type
    def collect(wav, count, _events):
        if count > 0:
            pieces.append(np.ctypeslib.as_array(wav, shape=(count,)).astype(np.float32) / 32768.0)
        return 0

    lib.espeak_SetSynthCallback(collect)
    lib.espeak_Synth.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int,
                                 ctypes.c_uint,
                                 ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
    for text in texts:
        encoded = text.encode()
        # POS_CHARACTER, espeakCHARS_AUTO
        lib.espeak_Synth(encoded, len(encoded) + 1, 0, 1, 0, 0, None, None)
        lib.espeak_Synchronize()
        pieces.append(np.zeros(int(pause * native), np.float32))
    audio = np.concatenate(pieces)
    times = np.arange(int(len(audio) * rate / native)) / rate
    return np.interp(times, np.arange(len(audio)) / native, audio).astype(np.float32)


def silero_vad(model: bytes, audio: np.ndarray, count: int = 64, rate: int = 16000) -> dict[str, np.ndarray]:
    """Chunks of ``audio`` as Silero VAD's own wrapper feeds them (512 new samples after the
    previous 64, the sample rate), each with the recurrent state the FP32 model reached over the
    audio before it: ``count`` of them, evenly spread over speech and pauses."""
    import onnxruntime as ort

    chunk, context = 512, 64
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    state = np.zeros((2, 1, 128), np.float32)
    previous = np.zeros(context, np.float32)
    inputs, states = [], []
    for start in range(0, len(audio) - chunk + 1, chunk):
        window = np.concatenate([previous, audio[start : start + chunk]])[None]
        inputs.append(window[0])
        states.append(state[:, 0])
        _, state = session.run(None,
                               {"input": window, "state": state, "sr": np.array(rate, np.int64)})
        previous = window[0, -context:]
    picked = np.linspace(0, len(inputs) - 1, min(count, len(inputs))).round().astype(int)
    return {"input": np.stack(inputs)[picked], "state": np.stack(states)[picked],
            "sr": np.full(len(picked), rate, np.int64)}


def _paragraph(draw: ImageDraw.ImageDraw, top: int, left: int, right: int, sentences: Sequence[str],
               font: ImageFont.FreeTypeFont) -> int:
    """Sentences set as a justified-left paragraph between ``left`` and ``right``; returns the
    bottom."""
    line, y = "", top
    for word in " ".join(sentences).split():
        if line and draw.textlength(f"{line} {word}", font=font) > right - left:
            draw.text((left, y), line, fill=20, font=font)
            line, y = word, y + font.size + 4
        else:
            line = f"{line} {word}".strip()
    draw.text((left, y), line, fill=20, font=font)
    return y + font.size + 4


def _table(draw: ImageDraw.ImageDraw, top: int, left: int, right: int, rows: int,
           font: ImageFont.FreeTypeFont) -> int:
    """A ruled table of figures, ``rows`` rows of four columns; returns the bottom."""
    height, width = font.size + 10, (right - left) // 4
    for r in range(rows + 1):
        draw.line((left, top + r * height, right, top + r * height), fill=40, width=1)
    for c in range(5):
        draw.line((left + c * width, top, left + c * width, top + rows * height), fill=40, width=1)
    for r in range(rows):
        for c in range(4):
            cell = ("Item", "Count", "Share", "Change")[c] if r == 0 else f"{(r * 37 + c * 11) % 97}.{r + c}"
            draw.text((left + c * width + 6, top + r * height + 4), cell, fill=20, font=font)
    return top + rows * height


def _sentences(start: int, count: int) -> tuple[str, ...]:
    return tuple(SENTENCES[(start + k) % len(SENTENCES)] for k in range(count))


def doc_layout(images: Mapping[str, bytes], height: int = 800, width: int = 608, count: int = 24) -> dict[str, np.ndarray]:
    """Document pages rendered as a layout detector sees them: a title, paragraphs, a photo
    (scikit-image's) with its caption, a ruled table, a page header and footer, in an order, size
    and place that change per page; resized to height×width, RGB, ImageNet normalisation
    (PaddleDetection's PicoDet preprocessing)."""
    photos = ("astronaut.png", "coffee.png", "chelsea.png", "rocket.jpg", "motorcycle_left.png")
    pages = []
    for i in range(count):
        page = Image.new("RGB", (1224, 1584), "white")
        draw = ImageDraw.Draw(page)
        body, small = _font(22), _font(18)
        draw.text((90, 40), f"Technical report {i + 1}", fill=90, font=small)
        draw.text((90, 100), SENTENCES[i % len(SENTENCES)].rstrip("."), fill=0, font=_font(40))
        y = _paragraph(draw, 190, 90, 1134, _sentences(i, 2 + i % 4), body) + 40
        blocks = (["figure", "table", "text"], ["text", "table", "figure"],
                  ["table", "figure", "text"])[i % 3]
        for block in blocks:
            if block == "figure":
                photo = _image(images[photos[i % len(photos)]])
                side = 360 + (i % 4) * 80
                photo = photo.resize((side, round(side * photo.height / photo.width)),
                                     Image.BILINEAR)
                left = 90 + (i % 3) * (1044 - side) // 2
                page.paste(photo, (left, y))
                y += photo.height + 10
                draw.text((left, y), f"Figure {i + 1}. {SENTENCES[(i + 5) % len(SENTENCES)]}",
                          fill=30, font=small)
                y += 60
            elif block == "table":
                y = _table(draw, y, 90, 1134, 3 + i % 4, small) + 40
            else:
                y = _paragraph(draw, y, 90, 1134, _sentences(i + 7, 2 + (i // 3) % 3), body) + 40
        draw.text((560, 1520), f"- {i + 1} -", fill=60, font=small)
        resized = np.asarray(page.resize((width, height), Image.BILINEAR))
        pages.append(_normalise(resized, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)))
    return {"image": np.stack(pages)}
