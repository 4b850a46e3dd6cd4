"""The thor_bert recipe on a tiny BERT and the first documents of the real corpus: a training interrupted mid-epoch,
rerun, gives the history and weights of an uninterrupted one (THOR's statistics, inverses and counters and the
baseline's Adam moments restored); the parameters that take weight decay (the script's decay filter); Punkt fitted
on the train documents only."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.runner import tiny_parameters
from tests.support.text import read_documents
from trainlib.engine.callbacks import Callback
from trainlib.metrics import TIMESTAMP_KEY, TRAIN_COMPILE_S, TRAIN_EPOCH_TIME_S, TRAIN_SEQUENCES_PER_S
from trainlib.recipes.language_model import build_bert, prepare_language_model
from trainlib.recipes.thor_bert import train_bert_control, train_bert_thor

TIMINGS = {TIMESTAMP_KEY, TRAIN_COMPILE_S, TRAIN_EPOCH_TIME_S, TRAIN_SEQUENCES_PER_S}


@pytest.fixture(scope="module")
def language():
    params = tiny_parameters(".")
    return params.thor_bert, prepare_language_model(params.thor_bert, params.runtime, params.distributed)


class Interrupt(Exception):
    pass


class InterruptAt(Callback):
    """Raises in epoch ``epoch`` (0-based) after step ``step``, as a killed process stops mid-epoch."""

    def __init__(self, epoch: int, step: int):
        self.epoch, self.step = epoch, step

    def on_step_end(self, epoch: int, step: int, loss: float) -> None:
        if (epoch, step) == (self.epoch, self.step):
            raise Interrupt


def without_timings(history):
    return [
        {key: value for key, value in row.items() if key not in TIMINGS and "_step_s" not in key} for row in history
    ]


@pytest.mark.slow  # six trainings (about 45 s): the slow tier's
@pytest.mark.parametrize(("training", "train"), [("thor", train_bert_thor), ("control", train_bert_control)])
def test_an_interrupted_training_resumes_to_the_uninterrupted_history(language, tmp_path, training, train):
    thor_bert, context = language
    section = getattr(thor_bert, training)
    initial = build_bert(context.network, context.vocab_size, context.runtime)

    def in_folder(name: str):
        checkpoint = section.checkpoint.model_copy(update={"dir": str(tmp_path / name)})
        return section.model_copy(update={"checkpoint": checkpoint})

    whole = train(context, initial, in_folder("whole"))
    interrupted = in_folder("interrupted")
    with pytest.raises(Interrupt):
        train(context, initial, interrupted, callbacks=[InterruptAt(epoch=1, step=1)])  # in the last epoch
    assert [p.name for p in (tmp_path / "interrupted").glob("epoch_*.ckpt")] == ["epoch_0001.ckpt"]
    resumed = train(context, initial, interrupted)

    assert without_timings(resumed.history) == without_timings(whole.history)
    assert resumed.checkpoint.params.keys() == whole.checkpoint.params.keys()
    for name, value in whole.checkpoint.params.items():
        np.testing.assert_array_equal(resumed.checkpoint.params[name], value, err_msg=name)
    if training == "thor":
        assert any(name.startswith("optimizer.thor.") for name in whole.checkpoint.params)
    assert_decay_filter(whole.step.optimizer, section.weight_decay)


def assert_decay_filter(optimizer, weight_decay: float) -> None:
    """Exactly the LayerNorm parameters and the biases are left out of weight decay (the script's decay_filter)."""
    # MindSpore's per-parameter weight decay of a grouped optimizer, in the order of its parameters
    decay = {p.name: value for p, value in zip(optimizer.parameters, optimizer.group_weight_decay, strict=True)}
    exempt = {name for name, value in decay.items() if value == 0.0}
    assert exempt == {name for name in decay if "layernorm" in name.lower() or "bias" in name.lower()}
    decayed = set(decay) - exempt
    assert any("embedding" in name for name in decayed)  # the word table (tied to the masked-LM decoder) decays
    assert all(decay[name] == pytest.approx(weight_decay) for name in decayed)


def test_sentences_are_cut_by_punkt_fitted_on_the_train_documents_only(tmp_path):
    """A made-up abbreviation used only in held-out text: fitted on every document, Punkt learns it and keeps the
    sentence whole; fitted on the train documents (as split_corpus does), it cuts there."""
    from trainlib.params import BertCorpusParams
    from trainlib.text.pretraining import split_corpus

    prose = "Plain sentences about values and names. They say nothing unusual at all."
    for index in range(6):
        (tmp_path / f"doc{index}.rst.txt").write_text(f"Title\n=====\n\n{prose} {prose}\n")
    corpus = BertCorpusParams(root=str(tmp_path), held_out_fraction=0.2, split_seed=0, max_documents=None)
    _, held_out = split_corpus(corpus)
    unusual = " ".join(f"The zqv. {word} value is set here by the zqv. rule." for word in ("first", "next") * 20)
    (tmp_path / held_out[0].name).write_text(f"Title\n=====\n\n{unusual}\n")
    _, held_out = split_corpus(corpus)
    assert "The zqv." in held_out[0].sentences  # not learnt as an abbreviation: the held-out text was not fitted
    fitted_on_everything = {document.name: document for document in read_documents(tmp_path)}
    assert fitted_on_everything[held_out[0].name].sentences[0].startswith("The zqv. first value")  # learnt there
