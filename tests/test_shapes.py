"""Every shape a deployment runs: a dynamic model's plans judged at each (a decoder's prefill and decode, a
profile's ends, the data's other shapes), the loss the worst there, the exports' profiles spanning them; and the
shapes a user gives (--shape, --max-shape), refused before the work where they cannot run."""

from __future__ import annotations

import json
from pathlib import Path

import builders
import numpy as np
import onnx
import pytest
import searching
from builders import _model, decoder_data, kv_decoder, save, session
from cli import clean, refused, run
from onnx import TensorProto, helper, numpy_helper
from searching import main

import autoprec
from autoprec.analysis.decoder import find_decoder
from autoprec.analysis.shapes import declared_inputs, output_specs
from autoprec.core.errors import AutoprecError
from autoprec.core.profile import ShapeProfile

MAX_LOSS = 0.01


def _decoder_of(model: onnx.ModelProto):
    return find_decoder(declared_inputs(model), output_specs(model))


def test_a_kv_cache_decoder_is_found_by_its_names_or_by_an_output_fed_back():
    optimum = _decoder_of(kv_decoder())
    assert optimum.tokens == "input_ids" and optimum.logits == "logits" and optimum.mask == "attention_mask"
    assert [(p.past, p.present, p.axis) for p in optimum.cache] == [
        ("past_key_values.0.key", "present.0.key", 2), ("past_key_values.0.value", "present.0.value", 2)]
    other = _decoder_of(kv_decoder(cache_names=("state_in", "state_out")))  # names that pair nothing: by the dims
    assert [(p.past, p.present) for p in other.cache] == [("state_in.key", "state_out.key"),
                                                          ("state_in.value", "state_out.value")]
    encoder = _model([helper.make_node("Identity", ["ids"], ["out"])],
                     [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "sequence"])],
                     [helper.make_tensor_value_info("out", TensorProto.INT64, ["batch", "sequence"])], [])
    assert _decoder_of(encoder) is None


def _check_at_every_phase(given: Path, shipped: Path, vocab: int = 24) -> float:
    """Independent of autoprec: the shipped model against the given one at prefill (7 tokens and 1) and at decode
    after pasts of 0 to 40 made by the given model, batch 1 and 3; the worst 1 - cosine of the logits."""
    ref, cand, worst = session(given), session(shipped), 0.0
    rng = np.random.default_rng(5)

    def feeds(ids, past, length):
        rows = len(ids)
        found = {"input_ids": ids, "attention_mask": np.ones((rows, length + ids.shape[1]), np.int64),
                 "position_ids": np.tile(np.arange(length, length + ids.shape[1]), (rows, 1))}
        for kv in ("key", "value"):
            found[f"past_key_values.0.{kv}"] = past[kv] if past else np.zeros((rows, 1, 0, 16), np.float32)
        return found

    def loss(a, b):
        a, b = a.reshape(-1, a.shape[-1]).astype(np.float64), b.reshape(-1, b.shape[-1]).astype(np.float64)
        return float(1 - ((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).mean())

    for rows in (1, 3):
        for tokens in (7, 1):
            f = feeds(rng.integers(0, vocab, (rows, tokens)), None, 0)
            worst = max(worst, loss(ref.run(["logits"], f)[0], cand.run(["logits"], f)[0]))
        ids, past = rng.integers(0, vocab, (rows, 1)), None
        for length in range(41):
            f = feeds(ids, past, length)
            want = dict(zip([o.name for o in ref.get_outputs()], ref.run(None, f)))
            worst = max(worst, loss(want["logits"], cand.run(["logits"], f)[0]))
            past = {kv: want[f"present.0.{kv}"] for kv in ("key", "value")}
            ids = want["logits"][:, -1:].argmax(-1)
    return worst


@pytest.fixture(scope="module")
def decoder_searched(tmp_path_factory):
    folder = tmp_path_factory.mktemp("decoder")
    model = save(kv_decoder(), folder / "decoder.onnx")
    data = decoder_data(model, folder / "tokens.npz")  # one shape: 5 tokens after a past of 6
    out = folder / "out"
    searching.search(autoprec.SearchConfig(autoprec.InputSpec(model, data=data),
                                           judge=autoprec.JudgeSpec(max_loss=MAX_LOSS),
                                           study=autoprec.StudySpec(budget=6, seed=2), out=out))
    return model, out


def test_a_decoder_searched_with_one_shape_is_judged_at_prefill_and_decode(decoder_searched):
    model, out = decoder_searched
    pareto = json.loads((out / "pareto.json").read_text())
    search = pareto["search"]
    assert search["metric"] == "generation"  # a decoder's default: what its users see
    assert [p["name"] for p in search["judged_shapes"]] == ["opt", "prefill", "first token", "decode·5", "decode·45"]
    runs = {p["name"]: p["runs"] for p in search["judged_shapes"]}
    assert runs["prefill"] == 1 and runs["decode·5"] + runs["decode·45"] >= 16 and runs["opt"] == 0
    trials = json.loads((out / "trials.json").read_text())["trials"]
    for trial in trials:
        shapes = trial["by_shape"]
        assert set(shapes) == {*runs, "generation"}
        assert trial["accuracy_loss"] == max(s["loss"] for s in shapes.values())
        assert {p for p, s in shapes.items() if "latency_ms" in s} == {p for p, n in runs.items() if n}
    cache = next(i for i in search["profile"]["inputs"] if i["name"] == "past_key_values.0.key")
    assert cache["min"][2] == 0 and cache["opt"][2] == 6 and cache["max"][2] == 45  # a past of 0 to the longest judged
    best = onnx.load(str(out / "best" / "model.onnx"), load_external_data=False)
    dims = [d.dim_param or d.dim_value for d in best.graph.input[1].type.tensor_type.shape.dim]
    assert dims == ["batch_size", 1, "past_sequence_length", 16]
    assert _check_at_every_phase(model, out / "best" / "model.onnx") <= MAX_LOSS


def test_a_decoders_exports_carry_its_phases(decoder_searched, tmp_path, capsys):
    _, out = decoder_searched
    assert main(["report", str(out), "--output", str(tmp_path / "report.html")]) == 0
    assert " ms per request, " in (tmp_path / "report.html").read_text()  # its prompt, then its decode steps
    assert main(["check", str(out)]) == 0  # its points made again as the search made them: the same data
    assert "PASS" in capsys.readouterr().out
    assert main(["export", str(out), "--format", "triton", "--out", str(tmp_path / "triton")]) == 0
    config = (tmp_path / "triton" / "decoder" / "config.pbtxt").read_text()
    assert "dynamic_batching {" not in config and "max_batch_size: 0" in config and "sequence_batching" in config
    assert main(["export", str(out), "--format", "trtexec", "--out", str(tmp_path / "trtexec"),
                 "--dim", "past_sequence_length=0:512"]) == 0
    script = (tmp_path / "trtexec" / "build.sh").read_text()
    assert "past_key_values.0.key:1x1x0x16" in script and "past_key_values.0.key:1x1x512x16" in script
    assert "attention_mask:1x517" in script  # the mask's past + sequence, widened with the past
    assert main(["export", str(out), "--format", "markdown", "--out", str(tmp_path / "card")]) == 0
    card = (tmp_path / "card" / "BUILD.md").read_text()
    assert "prefill, first token, decode·5, decode·45" in card and "no dynamic batching" in card


def test_a_decoder_searched_on_prompts_with_an_empty_past_is_checked_and_exported_from_its_result(tmp_path,
                                                                                                   capsys):
    """Prompts with an empty past (prefill data) record a past of 0 among the search's shapes: check, diagnose and
    the exports made the data's shapes again from that record and refused its 0 as a --shape nobody gave."""
    model = save(kv_decoder(), tmp_path / "decoder.onnx")
    data = decoder_data(model, tmp_path / "prompts.npz", items=6, tokens=5, past=0)
    out = tmp_path / "out"
    searching.search(autoprec.SearchConfig(autoprec.InputSpec(model, data=data), judge=autoprec.JudgeSpec(max_loss=MAX_LOSS),
                                           study=autoprec.StudySpec(budget=3, seed=2), out=out))
    from autoprec.results.files import read_result_dir

    assert read_result_dir(out).how_measured().shapes["past_key_values.0.key"][2] == 0
    assert main(["check", str(out)]) == 0 and "PASS" in capsys.readouterr().out
    assert main(["export", str(out), "--format", "trtexec", "--out", str(tmp_path / "trtexec")]) == 0
    # widened past its points: checked at the new max, its past (none in the data) made of zeros
    assert main(["export", str(out), "--format", "trtexec", "--out", str(tmp_path / "wide"),
                 "--dim", "past_sequence_length=0:64"]) == 0
    checked = json.loads((tmp_path / "wide" / "export.json").read_text())["checked_against_source"]
    assert checked[-1]["point"] == "max (widened)" and checked[-1]["shapes"]["past_key_values.0.key"][2] == 64
    # and on the command line: an empty past is a --shape as it is a --min-shape; a batch of 0 is not
    refused(["search", str(model), "--shape", "input_ids=0x5"], capsys, "dims must be whole numbers above 0")


def test_a_decoders_prompts_alone_are_its_data_and_its_shapes_need_only_the_tokens(tmp_path, capsys):
    """The data a user has for a decoder is prompts: token ids alone are its data (each past made zero-long, the
    mask and positions as a first run takes them), the pasts then made by the FP32 model as for any data; without
    data, --shape of the tokens alone sizes the past (0) and the mask (past + tokens)."""
    model = save(kv_decoder(), tmp_path / "decoder.onnx")
    prompts = tmp_path / "prompts.npz"
    np.savez(prompts, input_ids=np.random.default_rng(5).integers(0, 24, (6, 7)))
    out = tmp_path / "out"
    assert main(["search", str(model), "--data", str(prompts), "--budget", "3", "--out", str(out), "--no-plots",
                 "--no-progress", "--retime-seconds", "0.2"]) == 0
    said = " ".join(capsys.readouterr().err.split())
    assert "prompts alone: past_key_values.0.key, past_key_values.0.value, attention_mask and 1 more made" in said
    pareto = json.loads((out / "pareto.json").read_text())
    assert [p["name"] for p in pareto["search"]["judged_shapes"]][:4] == ["opt", "prefill", "first token", "decode·7"]
    assert main(["check", str(out), "--max-loss", "1"]) == 0
    assert main(["search", str(model), "--shape", "input_ids=1x8", "--budget", "2", "--out", str(tmp_path / "random"),
                 "--no-plots", "--no-progress", "--retime-seconds", "0.2"]) == 0
    said = " ".join(capsys.readouterr().err.split())
    assert "dim past_sequence_length + sequence_length set to 8" in said and "past_sequence_length set to 0" in said


def _summing_model() -> onnx.ModelProto:
    """x [N, sequence, 16] summed over its sequence, then a MatMul: at a long sequence the sum is wide, at a short
    one narrow; INT8 calibrated on both quantizes the narrow one coarsely."""
    weight = numpy_helper.from_array(np.random.default_rng(1).normal(0, 1, (16, 32)).astype(np.float32), "w")
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["s"], "sum", keepdims=0),
             helper.make_node("MatMul", ["s", "w"], ["y"], "project")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "sequence", 16])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 32])], [weight, axes])


def test_a_plan_right_at_the_datas_shape_and_wrong_at_another_is_not_shipped(tmp_path, capsys):
    model = save(_summing_model(), tmp_path / "summing.onnx")
    np.savez(tmp_path / "data.npz", x=np.random.default_rng(2).uniform(-1, 1, (16, 256, 16)).astype(np.float32))
    out = tmp_path / "out"
    assert main(["search", str(model), "--data", str(tmp_path / "data.npz"), "--max-loss", "0.001", "--budget", "3",
                 "--no-warm-start", "--no-early-reject", "--precisions", "int8,fp32", "--out", str(out)]) == 0
    trials = {t["trial"]: t for t in json.loads((out / "trials.json").read_text())["trials"]}
    int8 = next(t for t in trials.values() if t["plan"]["counts"]["int8"])
    assert int8["by_shape"]["opt"]["loss"] <= 0.001 < int8["by_shape"]["min"]["loss"] == int8["accuracy_loss"]
    assert not int8["feasible"]
    assert json.loads((out / "best" / "plan.json").read_text())["plan"]["counts"]["int8"] == 0
    capsys.readouterr()
    assert main(["show", str(out)]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "judged at 2 shapes" in said and "min (the profile's min: x 1x1x16)" in said


def test_a_named_dim_widens_every_input_declaring_it_and_their_sums():
    declared = {"ids": ("batch", "sequence_length"), "past": ("batch", 1, "past_sequence_length", 4),
                "mask": ("batch", "past_sequence_length + sequence_length")}
    opt = {"ids": (1, 5), "past": (1, 1, 6, 4), "mask": (1, 11)}
    profile = ShapeProfile.fixed(opt)
    profile = ShapeProfile(tuple(type(i)(i.name, declared[i.name], i.min, i.opt, i.max) for i in profile.inputs))
    wide = profile.with_dims({"past_sequence_length": (0, 6, 512)})
    assert wide.at("min") == {"ids": (1, 5), "past": (1, 1, 0, 4), "mask": (1, 5)}
    assert wide.at("max") == {"ids": (1, 5), "past": (1, 1, 512, 4), "mask": (1, 517)}
    with pytest.raises(AutoprecError, match="--dim past_sequence_length=0:12:512: the search measures "
                                            "past_sequence_length at 6"):
        profile.with_dims({"past_sequence_length": (0, 12, 512)})
    with pytest.raises(AutoprecError, match="--dim past: no input declares a dim of that name"):
        profile.with_dims({"past": (0, None, 512)})
    with pytest.raises(AutoprecError, match="--dim past_sequence_length=0:0: the search measures "
                                            "past_sequence_length at 6 .* e.g. 0:6"):
        profile.with_dims({"past_sequence_length": (0, None, 0)})


def test_shape_weights_name_a_judged_shape_or_phase(tmp_path, capsys):
    model = save(kv_decoder(), tmp_path / "decoder.onnx")
    data = decoder_data(model, tmp_path / "tokens.npz", items=4)
    assert main(["search", str(model), "--data", str(data), "--shape-weights", "prompt=1", "--budget", "1",
                 "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "--shape-weights prompt: no such point; the points are opt, prefill, first token, decode·5" in err
    fixed, data = builders.conv_with_data(tmp_path, 8)  # judged at its one shape: a weight there is taken for nothing
    refused(["search", str(fixed), "--data", str(data), "--shape-weights", "opt=3", "--budget", "1", "--out",
             str(tmp_path / "fixed")], capsys, "--shape-weights opt: this model is judged at its data's one shape")


def test_a_decoders_data_in_a_file_per_phase_is_judged_at_each_phase(tmp_path):
    """A folder of one .npz per phase, each a batch of items (rows along the batch dim): the file of the most
    items is the search's shape, every other file a point judged beside the prefill and decode ones."""
    from autoprec.analysis.data import build_dataset, item_shapes
    from autoprec.analysis.model import analyse
    from autoprec.analysis.shape_points import judged_shapes
    from autoprec.core.search_space import load_search_space

    model = save(kv_decoder(), tmp_path / "decoder.onnx")
    folder = tmp_path / "phases"
    folder.mkdir()
    decoder_data(model, folder / "decode.npz", items=8)  # 5 tokens after a past of 6
    rows, tokens = 3, 7
    np.savez(folder / "prompts.npz", input_ids=np.random.default_rng(4).integers(0, 24, (rows, tokens)),
             attention_mask=np.ones((rows, tokens), np.int64), position_ids=np.tile(np.arange(tokens), (rows, 1)),
             **{f"past_key_values.0.{kv}": np.zeros((rows, 1, 0, 16), np.float32) for kv in ("key", "value")})
    inputs = declared_inputs(onnx.load(str(model)))
    info = analyse(model, load_search_space(), data_shapes=item_shapes(folder, inputs))
    measured, dataset = judged_shapes(info, build_dataset(folder, info.inputs))
    points = {p.name: p for p in dataset.points}
    assert list(points) == ["opt", "prefill", "first token", "decode·5", "decode·45", "data·1"]
    assert points["data·1"].said == "the data's items: batch 1, 7 token(s) after a past of 0"
    assert points["data·1"].shapes["past_key_values.0.key"] == (1, 1, 0, 16)
    assert len(dataset.other_shapes) == rows


def test_decode_steps_alone_are_judged_at_a_prompt_as_long_as_their_context(tmp_path):
    """Data of one token after a past (a user's decode steps) was judged at a "prefill" of that one token: a plan
    shipped so was 6 % over the limit on 7-token prompts, which no point had judged. The prefill is now a prompt of
    the context's length, the data's token first, then what the FP32 model generates from it."""
    from autoprec.analysis.data import build_dataset, item_shapes
    from autoprec.analysis.model import analyse
    from autoprec.analysis.shape_points import judged_shapes
    from autoprec.core.search_space import load_search_space

    model = save(kv_decoder(), tmp_path / "decoder.onnx")
    data = decoder_data(model, tmp_path / "decode.npz", items=4, tokens=1, past=6)
    info = analyse(model, load_search_space(), data_shapes=item_shapes(data, declared_inputs(onnx.load(str(model)))))
    _, dataset = judged_shapes(info, build_dataset(data, info.inputs))
    points = {p.name: p for p in dataset.points}
    assert list(points)[:5] == ["opt", "prefill", "first token", "decode·7", "decode·47"]
    assert points["prefill"].said == "prefill: batch 1, 7 token(s) after a past of 0"
    index = [p.name for p in dataset.points].index("prefill")
    prompts = [b["input_ids"] for b, at in zip(dataset.evaluation, dataset.evaluation_at) if at == index]
    assert prompts and all(p.shape == (1, 7) for p in prompts)
    assert {int(p[0, 0]) for p in prompts} <= {int(t) for t in np.load(data)["input_ids"][:, 0]}


def test_a_merged_decoders_branch_flag_is_fed_per_phase_and_never_stacked(tmp_path):
    """optimum's merged export takes ``use_cache_branch`` [1] (False: its graph without a past, True: with it):
    generation from several prompts keeps it one value per run, False at prefill and True at every decode step."""
    from autoprec.analysis.decoder import prefill
    from autoprec.measure.shaped import GenerationJudge

    model = kv_decoder()
    model.graph.input.append(helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1]))
    decoder = _decoder_of(model)
    assert decoder.branch == "use_cache_branch" and "use_cache_branch" in decoder.unbatched
    runs, fed = session(save(model, tmp_path / "merged.onnx")), []
    names = [o.name for o in runs.get_outputs()]

    def run(feeds):
        fed.append(feeds["use_cache_branch"].tolist())
        return dict(zip(names, runs.run(None, feeds)))

    prompt = {"input_ids": np.array([[1, 2, 3]]), "attention_mask": np.ones((1, 3), np.int64),
              "position_ids": np.arange(3)[None], "use_cache_branch": np.array([True]),
              **{f"past_key_values.0.{kv}": np.zeros((1, 1, 0, 16), np.float32) for kv in ("key", "value")}}
    prompts = [prefill(decoder, dict(prompt), prompt["input_ids"] + row) for row in range(3)]
    GenerationJudge.of(decoder, prompts, run)
    assert fed[0] == [False] and fed[1:] and all(flag == [True] for flag in fed[1:])


def test_a_constant_given_as_one_number_fills_an_input_of_shape_one():
    """``--const use_cache_branch=1`` for optimum's merged export, whose flag is declared [1], not a scalar."""
    from autoprec.analysis.model_info import TensorSpec
    from autoprec.analysis.shapes import check_feeds

    feeds = check_feeds([TensorSpec("use_cache_branch", (1,), "bool", None), TensorSpec("ids", (1, 3), "int64")],
                        {"use_cache_branch": 1.0})
    assert feeds["use_cache_branch"].shape == (1,) and feeds["use_cache_branch"].tolist() == [True]
    assert feeds["ids"].shape == (1, 3)


def test_a_dim_name_two_inputs_share_takes_the_size_one_shape_gives_and_conflicts_are_refused(tmp_path, capsys):
    """x[N,16] and z[16,N]: --shape x=3x16 carries N=3 to z (was z at N=1, an internal error); two --shape values
    that disagree on a shared dim are refused naming both."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.eye(16, dtype=np.float32), "w")
    model = builders.graph_model([helper.make_node("Transpose", ["z"], ["zt"], name="t", perm=[1, 0]),
                    helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
                    helper.make_node("Add", ["a", "zt"], ["y"], name="add")],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16]),
                    helper.make_tensor_value_info("z", TensorProto.FLOAT, [16, "N"])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16])], [weight])
    path = builders.save(model, tmp_path / "shared.onnx")
    code, err = run(["search", path, "--shape", "x=3x16", "--budget", "2", "--out", tmp_path / "o"], capsys)
    clean(code, err, allowed=(0,))
    assert "input z: dim N set to 3, as --shape x gives it" in err
    code, err = run(["search", path, "--shape", "x=3x16", "--shape", "z=16x2", "--out", tmp_path / "p"], capsys)
    clean(code, err, allowed=(2,))
    assert "--shape: inputs x and z share the dim 'N' but are given 3 and 2 there" in err


@pytest.mark.parametrize("dims", ["99999999999999999999x3x16x16", "10000000x3x16x16"])
def test_a_max_shape_this_machine_cannot_run_is_refused_before_the_search(tmp_path, capsys, dims):
    """A huge --max-shape ran the whole search, then the shipped model's check ran out of memory naming --shape
    (or a dim too large to represent was an internal error)."""
    model = builders.save(builders.conv_net(batch="N"), tmp_path / "conv.onnx")
    out = tmp_path / "o"
    refused(["search", model, "--max-shape", f"x={dims}", "--out", out], capsys, f"--max-shape x={dims}",
            "give a smaller --max-shape")
    assert not (out / "study.db").exists()


@pytest.mark.parametrize("option", ["--shape", "--max-shape", "--const"])
def test_an_input_given_twice_is_refused(tmp_path, capsys, option):
    model = builders.save(builders.line_reader(), tmp_path / "line.onnx")
    values = ("1", "2") if option == "--const" else ("1x3x8x32", "1x3x8x64")
    refused(["search", model, *["--shape", "x=1x3x8x32"] * (option == "--max-shape"),
             option, f"x={values[0]}", option, f"x={values[1]}", "--out", tmp_path / "o"], capsys,
            f"{option} x given twice ({values[0]} and {values[1]})")


def test_a_shape_one_input_is_given_fixes_the_dims_other_inputs_share(tmp_path, capsys):
    """--shape x=1x8x16 and random data: m's T was 'nothing fixes it', and the line said --data holds no arrays."""
    code, err = run(["search", builders.sharing_t(tmp_path), "--shape", "x=1x8x16", "--budget", "1", "--no-warm-start",
                     "--out", tmp_path / "o"], capsys)
    assert code == 0, err[-2000:]
    assert json.loads((tmp_path / "o" / "pareto.json").read_text())["model"]["inputs"]["m"]["shape"] == [1, 8, 1]
    last = refused(["search", builders.sharing_t(tmp_path), "--out", tmp_path / "p"], capsys, "nothing fixes it")
    assert last.endswith("or --data with arrays of that shape")


def test_a_decoders_similarity_loss_is_its_logits_token_by_token():
    """A decoder returns its logits and its KV cache: a cosine limit judges the logits, each token's row on its own
    (a prompt's seven positions at once, or the near-exact cache averaged in, would show a fraction of one token's
    loss), while a non-finite cache still fails the plan."""
    from autoprec.measure.accuracy import Metric
    from autoprec.measure.shaped import ShapedJudge, cosine_loss
    from autoprec.record.facts import ShapePoint

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 7, 50)).astype(np.float32)
    cache = rng.normal(size=(2, 2, 7, 4)).astype(np.float32)
    wrong = logits.copy()
    wrong[:, 3] = rng.normal(size=(2, 50))  # one position of seven unlike FP32's
    reference = [{"logits": logits, "present.0.key": cache}]
    judge = ShapedJudge(Metric("cosine"), reference, None, points=(ShapePoint("prefill", "prefill", {}),),
                        at=(0,), logits="logits")
    candidate = [{"logits": wrong, "present.0.key": cache}]
    loss = judge.loss(judge.metrics(candidate), candidate)
    assert loss == pytest.approx(cosine_loss(logits, wrong)) and loss > 0.1
    broken = [{"logits": logits, "present.0.key": np.full_like(cache, np.nan)}]
    assert judge.loss(judge.metrics(broken), broken) == float("inf")


def test_a_decoders_pasts_are_made_for_many_items_at_once_as_for_each_alone(tmp_path):
    """The FP32 model makes every data item's pasts in stacked runs (one run a step for up to 16 rows): each item's
    phases are those it gets alone, split back into the batches as given."""
    from autoprec.analysis import shape_points

    model = save(kv_decoder(), tmp_path / "decoder.onnx")
    data = dict(np.load(decoder_data(model, tmp_path / "tokens.npz", items=20)))
    batches = [{k: v[i:i + 1] for k, v in data.items()} for i in range(20)]
    decoder = _decoder_of(onnx.load(str(model)))
    fp32 = session(model)
    names = [o.name for o in fp32.get_outputs()]

    def run(batch):
        return dict(zip(names, fp32.run(None, batch)))

    together = shape_points._all_phases(decoder, batches, run, None)
    for batch, found in zip(batches, together):
        alone = shape_points._phases(decoder, batch, run, None)
        assert found.keys() == alone.keys()
        for point in alone:
            assert found[point].keys() == alone[point].keys()
            for name, value in alone[point].items():
                np.testing.assert_allclose(found[point][name], value, rtol=1e-4, atol=1e-5, err_msg=f"{point} {name}")
