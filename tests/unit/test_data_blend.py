"""data.blend: a Megatron-LM data blend built by megatron-core's BlendedMegatronDatasetBuilder over GPTDataset.
The samples phoenix reads at a position are those the builder yields when configured as Megatron-LM's
pretrain_gpt.py configures it (its sizes for train, validation and test); bad blends are refused naming the
field."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import yaml

from phoenix_hpc.config.schema import JobConfig
from phoenix_hpc.errors import ConfigError, DataError
from phoenix_hpc.validation import parse_model

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
         "upsilon phi chi psi omega").split()


def _text_tree(root: Path, seed: int, files: int = 600) -> Path:
    rng = random.Random(seed)
    root.mkdir(parents=True)
    for i in range(files):
        words = [rng.choice(WORDS) for _ in range(rng.randint(10, 60))]
        (root / f"doc{i:02d}.txt").write_text(" ".join(words) + "\n")
    return root


@pytest.fixture(scope="module")
def two_datasets(tmp_path_factory):
    from phoenix_hpc.data.prepare import prepare_dataset

    tmp = tmp_path_factory.mktemp("blend")
    out = []
    for name, seed in (("a", 1), ("b", 2)):
        prepare_dataset(_text_tree(tmp / f"text-{name}", seed), tmp / name / "ds")
        out.append(str(tmp / name / "ds"))
    return out


def _cfg(data: dict, steps: int = 6, gbs: int = 8, seq: int = 32, seed: int = 1234) -> JobConfig:
    return parse_model(JobConfig, {"name": "b", "data": data, "model": {"seq_length": seq},
                                   "training": {"steps": steps, "global_batch_size": gbs, "micro_batch_size": 2,
                                                "seed": seed}}, source="test")


def _megatron_lm_train_split(prefixes, weights, split, seq, seed, train_iters, gbs, vocab=256):
    """The train dataset exactly as Megatron-LM's pretrain_gpt.py builds it (train_valid_test_datasets_provider
    with the default --eval-interval 1000 and --eval-iters 100), independently of phoenix_hpc.data.blend."""
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    class Tok:
        vocab_size, eod, unique_identifiers = vocab, 0, {"class": "test"}

    eval_interval, eval_iters = 1000, 100
    sizes = [train_iters * gbs, (train_iters // eval_interval + 1) * eval_iters * gbs, eval_iters * gbs]
    config = GPTDatasetConfig(random_seed=seed, sequence_length=seq, blend=(prefixes, weights), split=split,
                              tokenizer=Tok(), reset_position_ids=False, reset_attention_mask=False,
                              eod_mask_loss=False, path_to_cache=None, mmap_bin_files=True)
    return BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()[0]


@pytest.mark.parametrize("split, weights", [("969,30,1", [0.3, 0.7]), ("100,0,0", [0.3, 0.7]),
                                            ("98,2", None), ("969,30,1", "one")])
def test_the_samples_of_the_first_steps_are_megatron_lms(two_datasets, split, weights):
    from phoenix_hpc.data.blend import BlendSamples, blend_key

    prefixes = two_datasets[:1] if weights == "one" else two_datasets
    weights = None if weights == "one" else weights
    blend = [{"path": p} if weights is None else {"path": p, "weight": w}
             for p, w in zip(prefixes, weights or [None] * len(prefixes))]
    ours = BlendSamples(blend_key(_cfg({"blend": blend, "split": split})))
    ref = _megatron_lm_train_split(prefixes, weights, split, 32, 1234, 6, 8)
    x, y = ours.batch(0, 3 * 8)  # the first three steps
    for pos in range(3 * 8):
        item = ref[pos]
        assert np.array_equal(x[pos].numpy(), np.asarray(item["tokens"])), pos
        assert np.array_equal(y[pos].numpy(), np.asarray(item["labels"])), pos
    assert torch_equal_shifted(x, y)
    if len(prefixes) == 2:  # both datasets contribute (the blend is not one dataset in disguise)
        assert {int(ours.dataset.dataset_index[i]) for i in range(48)} == {0, 1}


def torch_equal_shifted(x, y) -> bool:
    return bool((x[:, 1:] == y[:, :-1]).all())


def test_a_different_seed_or_weight_gives_other_samples(two_datasets):
    from phoenix_hpc.data.blend import BlendSamples, blend_key

    blend = [{"path": two_datasets[0], "weight": 0.3}, {"path": two_datasets[1], "weight": 0.7}]
    base = BlendSamples(blend_key(_cfg({"blend": blend}))).batch(0, 8)[0]
    other_seed = BlendSamples(blend_key(_cfg({"blend": blend}, seed=7))).batch(0, 8)[0]
    other_weight = BlendSamples(blend_key(_cfg({"blend": [dict(blend[0], weight=0.9), blend[1]]}))).batch(0, 8)[0]
    assert not base.equal(other_seed) and not base.equal(other_weight)


def test_open_blend_builds_once_per_process(two_datasets):
    from phoenix_hpc.data.blend import open_blend

    cfg = _cfg({"blend": [{"path": two_datasets[0], "weight": 1.0}]})
    assert open_blend(cfg) is open_blend(cfg)


@pytest.mark.parametrize("data, needle", [
    ({"blend": []}, "data.blend"),
    ({"blend": [{"path": "a", "weight": 0}]}, "data.blend.0.weight"),
    ({"blend": [{"path": "a", "weight": -1.0}]}, "data.blend.0.weight"),
    ({"blend": [{"path": "a"}, {"path": "b", "weight": 1.0}]}, "weights given for some entries only"),
    ({"blend": [{"path": "a", "weight": 1.0}], "split": "90,10,0,5"}, "is not a split"),
    ({"blend": [{"path": "a", "weight": 1.0}], "split": "ninety"}, "is not a split"),
    ({"blend": [{"path": "a", "weight": 1.0}], "split": "0,50,50"}, "positive train part"),
    ({"path": "a", "split": "969,30,1"}, "applies to data.blend only"),
    ({"path": "a", "blend": [{"path": "a", "weight": 1.0}]}, "set exactly one of"),
])
def test_bad_blends_are_refused_naming_the_field(data, needle):
    with pytest.raises(ConfigError) as exc:
        _cfg(data)
    assert needle in str(exc.value), str(exc.value)


def test_a_missing_prefix_is_a_data_error_naming_it(two_datasets, tmp_path):
    from phoenix_hpc.data.blend import BlendSamples, blend_key

    missing = str(tmp_path / "nope")
    cfg = _cfg({"blend": [{"path": two_datasets[0], "weight": 1.0}, {"path": missing, "weight": 1.0}]})
    with pytest.raises(DataError, match="nope") as exc:
        BlendSamples(blend_key(cfg))
    assert str(exc.value).startswith(f"data.blend[1].path {missing!r}"), str(exc.value)


def test_a_split_part_without_documents_is_refused_not_built(tmp_path):
    from phoenix_hpc.data.blend import BlendSamples, blend_key
    from phoenix_hpc.data.prepare import prepare_dataset
    from phoenix_hpc.data.split import document_ranges, split_vector

    assert document_ranges(split_vector("969,30,1"), 12) == [(0, 12), (12, 12), (12, 12)]
    assert document_ranges(split_vector("90,10"), 120) == [(0, 108), (108, 120), None]
    prepare_dataset(_text_tree(tmp_path / "t", 3, files=12), tmp_path / "small")
    cfg = _cfg({"blend": [{"path": str(tmp_path / "small"), "weight": 1.0}], "split": "969,30,1"})
    with pytest.raises(DataError, match=r"valid and test part .* holds no document \(12 documents"):
        BlendSamples(blend_key(cfg))


def test_submit_refuses_a_split_part_without_documents(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from phoenix_hpc.cli.main import cli
    from phoenix_hpc.data.prepare import prepare_dataset

    prepare_dataset(_text_tree(tmp_path / "t", 4, files=12), tmp_path / "small")
    cfg = {"name": "b", "data": {"blend": [{"path": str(tmp_path / "small"), "weight": 1.0}], "split": "98,2,0"},
           "parallelism": {"dp": 2}, "resources": {"nodes": 2, "spares": 1}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(cfg))
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli, ["submit", "--site", "local", "job.yaml", "--dry-run"])
    assert r.exit_code == 2, r.output
    assert "data.split '98,2,0': the valid part" in r.output and "12 documents" in r.output
    assert "Traceback" not in r.output
    cfg["data"]["split"] = "100,0,0"
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(cfg))
    assert CliRunner().invoke(cli, ["submit", "--site", "local", "job.yaml", "--dry-run"]).exit_code == 0


def test_relative_blend_paths_are_made_absolute_against_the_config_folder(tmp_path):
    from phoenix_hpc.config.load import load_job_config

    p = tmp_path / "cfg" / "job.yaml"
    p.parent.mkdir()
    p.write_text(yaml.safe_dump({"name": "b", "data": {"blend": [{"path": "../d/a", "weight": 1.0}]}}))
    cfg = load_job_config(p)
    assert cfg.data.blend[0].path == str((tmp_path / "d" / "a").resolve())
    assert cfg.data.prefixes == [str((tmp_path / "d" / "a").resolve())]
