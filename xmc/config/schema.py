"""The typed schema of ``params.yaml``: every key, its type, its range and its default.

:func:`validate_params` checks a loaded ``params.yaml`` against it and returns the same tree with
values coerced to their types and every missing key filled with its default, so the code reads
``cfg["key"]`` and the defaults live here only. A library builder given one section dict (by a stage, a test
or a direct caller, possibly partial) fills it with :func:`filled` before indexing it. Run overrides (``runs.<name>``,
``ramen.runs.<name>`` ...) stay partial (they are merged onto their defaults by the stages) but are
checked merged, so a misspelt key in a run is caught like one in a defaults section.

Errors are :class:`~xmc.errors.ConfigError` with one line each: ``params.yaml:<line>: <key path>:
<problem>``, with a did-you-mean for unknown keys.
"""

from __future__ import annotations

import copy
import difflib
import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_serializer, model_validator

from xmc.errors import ConfigError
from xmc.workspace import NAME

PosInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
PosFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]
Prob = Annotated[float, Field(ge=0, le=1)]
DropoutP = Annotated[float, Field(ge=0, lt=1)]
Seed = Annotated[int, Field(ge=0, le=2**32 - 1)]
IndexKind = Literal["exact", "hnsw", "ivf", "pq", "auto"]
SPLIT_WORDS = ("val", "tst")
METRIC_RE = re.compile(r"^(P|nDCG|PSP|PSnDCG|R)@[1-9][0-9]*$")


class Section(BaseModel):
    """Unknown keys are errors; values are coerced where lossless (``"5e-2"`` -> 0.05), refused otherwise.

    Fields named in ``OPTIONAL`` are left out of the dump when unset (None): they are keyword arguments whose
    default belongs to the component that takes them (a loss's own hyperparameters, an index's knobs)."""

    model_config = ConfigDict(extra="forbid", validate_default=True, validate_assignment=False)
    OPTIONAL: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _drop_unset_optionals(self, handler: Any) -> dict[str, Any]:
        out = handler(self)
        return {k: v for k, v in out.items() if not (k in self.OPTIONAL and v is None)}


# ------------------------------------------------------------------------------------------------
# data, validation, TF-IDF, evaluation
class ValidationSplit(Section):
    use_shipped: bool = True
    fraction: Annotated[float, Field(gt=0, lt=1)] = 0.1
    seed: Seed = 0


class Subsample(Section):
    trn: NonNegInt = 0
    tst: NonNegInt = 0
    val: NonNegInt = 0
    unit: Literal["documents", "instances"] = "documents"
    labels: Literal["all", "used"] = "all"


class DataConfig(Section):
    dataset_dir: str
    name: str | None = None   # the outputs' folder results/<name>/ (null: the dataset folder's name)
    layout: Literal["auto", "xc_raw", "jsonl"] = "auto"
    uid_separator: str | None = None
    text_fields: Annotated[list[str], Field(min_length=1)] = ["title", "content"]
    validation: ValidationSplit = ValidationSplit()
    subsample: Subsample = Subsample()
    open_labels: str | None = None   # a JSON-lines label catalogue appended to the dataset's label space

    @field_validator("dataset_dir")
    @classmethod
    def _non_empty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must be a non-empty path")
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        if v is not None and not NAME.match(v):
            raise ValueError("must be a folder name: letters, digits and . _ + - (not starting with one of these)")
        return v

    @field_validator("uid_separator")
    @classmethod
    def _separator(cls, v: str | None) -> str | None:
        if v is not None and (v == "" or "\n" in v):
            raise ValueError("must be a non-empty string without a newline, or null")
        return v


class ValidateConfig(Section):
    max_text_chars: PosInt = 2000
    max_label_chars: PosInt = 4000
    head_min_freq: PosInt = 100
    tail_max_freq: PosInt = 5

    @model_validator(mode="after")
    def _buckets(self) -> ValidateConfig:
        if self.tail_max_freq >= self.head_min_freq:
            raise ValueError(f"tail_max_freq ({self.tail_max_freq}) must be below head_min_freq ({self.head_min_freq})")
        return self


class TfidfConfig(Section):
    OPTIONAL = frozenset({"stop_words", "token_pattern"})
    ngram_max: Annotated[int, Field(ge=1, le=5)] = 2
    min_df: PosInt = 1
    max_df: Annotated[float, Field(gt=0, le=1)] = 1.0
    max_features: PosInt | None = None
    sublinear_tf: bool = True
    stop_words: Any = None   # null | "english" | a list of words

    @field_validator("stop_words")
    @classmethod
    def _stop_words(cls, v: Any) -> Any:
        if v is None or v == "english" or (isinstance(v, list) and all(isinstance(w, str) for w in v)):
            return v
        raise ValueError(f"must be null, 'english' or a list of words (got {v!r})")
    token_pattern: str | None = None   # None: scikit-learn's default, words of 2+ characters

    @field_validator("token_pattern")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            re.compile(v)
        except re.error as e:
            raise ValueError(f"not a regular expression ({e})") from None
        return v


class TfidfKnnConfig(Section):
    n_neighbors: PosInt = 10
    power: NonNegFloat = 1.0
    max_postings_per_term: NonNegInt = 0   # static pruning of the training side (xmc.sparse_topk.prune_postings)


class TfidfZeroShotConfig(Section):
    max_postings_per_term: NonNegInt = 0   # static pruning of the label side (xmc.sparse_topk.prune_postings)


class BootstrapConfig(Section):
    n_resamples: Annotated[int, Field(ge=10, le=1_000_000)] = 1000
    seed: Seed = 0
    level: Annotated[float, Field(gt=0.5, lt=1)] = 0.95
    unit: Literal["documents", "instances"] = "documents"


class EvaluateConfig(Section):
    top_k: Annotated[int, Field(gt=0, le=10_000)] = 100
    ks: Annotated[list[PosInt], Field(min_length=1)] = [1, 3, 5]
    recall_ks: list[PosInt] = [10, 100]
    propensity_a: PosFloat = 0.55
    propensity_b: PosFloat = 1.5
    bootstrap: BootstrapConfig = BootstrapConfig()

    @model_validator(mode="after")
    def _within_top_k(self) -> EvaluateConfig:
        for name in ("ks", "recall_ks"):
            big = [k for k in getattr(self, name) if k > self.top_k]
            if big:
                raise ValueError(f"{name} {big} exceed top_k ({self.top_k}): predictions hold only top_k labels")
        return self


# ------------------------------------------------------------------------------------------------
# the shared parts of every trained method
class EncoderConfig(Section):
    """One record for both encoder kinds: a run may switch ``kind`` and keep the other kind's keys."""

    kind: Literal["transformer", "bow"] = "transformer"
    # transformer
    model_dir: str | None = None
    pooling: Literal["mean", "cls"] = "mean"
    max_len_query: Annotated[int, Field(gt=0, le=8192)] = 32
    max_len_label: Annotated[int, Field(gt=0, le=8192)] = 32
    freeze_embeddings: bool = False
    # bag of words
    dim: Annotated[int, Field(gt=0, le=65536)] = 256
    n_buckets: Annotated[int, Field(gt=0, le=1 << 26)] = 1 << 18
    ngram_max: Annotated[int, Field(ge=1, le=5)] = 2
    seed: Seed = 0
    # both
    tied: bool = True
    dropout: DropoutP = 0.0
    # which part of a label text the label side reads: full | names (the name list with its tag, where the
    # dataset's label texts have the "names (tag): description" shape) | description
    label_text: Literal["full", "names", "description"] = "full"


LOSS_KEYS = {"decoupled_softmax": {"temperature"}, "softmax": {"temperature"}, "bce": {"temperature", "bias"},
             "softtopk": {"k", "alpha", "temperature", "n_iter"}, "triplet": {"margin", "temperature"}}


class LossConfig(Section):
    """A loss and its own keyword arguments; what is not given takes the loss class's default."""

    OPTIONAL = frozenset({"temperature", "margin", "k", "alpha", "n_iter", "bias"})
    name: Literal["decoupled_softmax", "softmax", "softtopk", "bce", "triplet"] = "decoupled_softmax"
    temperature: PosFloat | None = None
    margin: NonNegFloat | None = None   # triplet
    k: PosInt | None = None             # softtopk
    alpha: PosFloat | None = None       # softtopk
    n_iter: PosInt | None = None        # softtopk
    bias: float | None = None           # bce

    @model_validator(mode="after")
    def _keys_of_this_loss(self) -> LossConfig:
        given = {k for k in self.OPTIONAL if getattr(self, k) is not None}
        extra = given - LOSS_KEYS[self.name]
        if extra:
            raise ValueError(f"{sorted(extra)} not taken by the {self.name} loss (it takes {sorted(LOSS_KEYS[self.name])})")
        return self


class NegativesConfig(Section):
    OPTIONAL = frozenset({"kmeans_iters"})
    kind: Literal["in_batch", "hard", "all"] = "hard"
    shortlist_size: Annotated[int, Field(gt=0, le=100_000)] = 100
    negatives_per_query: NonNegInt = 1
    max_positives_per_query: NonNegInt = 0
    unsampled_positives: Literal["mask", "positive"] = "mask"
    positive_sampling: Literal["uniform", "inverse_propensity"] = "uniform"
    propensity_a: PosFloat = 0.55
    propensity_b: PosFloat = 1.5
    refresh_every_epochs: PosInt = 1
    refresh_every_steps: NonNegInt = 0   # also refresh every this many steps (0 = only per epoch)
    start_epoch: NonNegInt = 0
    index_kind: IndexKind = "auto"
    kmeans_iters: PosInt | None = None   # an IVF mining index's k-means iterations (None: faiss' 10)
    # also this many negatives per query from the labels whose names occur in it (xmc.lexical under the
    # label_names settings; positives removed; fixed for the run): the confusable senses a name match proposes
    name_match_per_query: NonNegInt = 0
    name_match_shortlist: Annotated[int, Field(gt=0, le=10_000)] = 20

    @model_validator(mode="after")
    def _shortlist(self) -> NegativesConfig:
        if self.kind == "hard" and self.negatives_per_query > self.shortlist_size:
            raise ValueError(f"negatives_per_query ({self.negatives_per_query}) exceeds shortlist_size "
                             f"({self.shortlist_size})")
        return self


class TrainSection(Section):
    epochs: NonNegInt = 1
    batch_size: Annotated[int, Field(gt=0, le=1_000_000)] = 64
    lr: PosFloat = 1e-4
    group_lr: dict[str, PosFloat] = {}
    group_optimizer: dict[str, Literal["adamw", "sgd"]] = {}
    schedule: Literal["linear", "cosine"] = "linear"
    weight_decay: NonNegFloat = 0.01
    warmup_ratio: Prob = 0.1
    grad_clip: NonNegFloat = 1.0
    label_chunk_size: PosInt = 2048
    max_steps_per_epoch: NonNegInt = 0
    checkpoint_every_steps: NonNegInt = 0
    # a checkpoint (at an epoch end, or every checkpoint_every_steps) is written only once this many minutes have
    # passed since the last one: a kill loses at most that much training; 0 = at every opportunity
    checkpoint_interval_minutes: NonNegFloat = 0.0
    eval_every_epochs: NonNegInt = 0
    val_max_instances: NonNegInt = 500
    # bfloat16 autocast of the score products and other matrix products: auto = on CUDA only; bf16 = on the CPU
    # too (CPUs with AVX512-BF16 or AMX do them about twice as fast; the bag sums and the optimiser stay float32)
    amp: Literal["auto", "off", "bf16"] = "auto"
    device: str = "auto"
    # lazy Adam of the sparse embedding tables (bag-of-words buckets, ASTRA/UniDEC classifiers): row_adam
    # updates the touched rows in one C pass (xmc/native; its torch path where no C compiler is found);
    # row_adam_torch always takes the torch path; torch_sparse_adam is torch's SparseAdam (same rule)
    sparse_optimizer: Literal["row_adam", "row_adam_torch", "torch_sparse_adam"] = "row_adam"
    # the two Adam moments of those tables (row_adam, row_adam_torch): float32, or bf16 = stored in bfloat16 with
    # stochastic rounding (half the optimiser's memory, fewer bytes moved per step; xmc/trainer/row_adam.py)
    sparse_moments: Literal["float32", "bf16"] = "float32"
    # data-parallel ranks on this machine (torchrun; gloo on CPU, NCCL on GPUs; xmc.trainer.distributed)
    nproc_per_node: Annotated[int, Field(ge=1, le=1024)] = 1
    # with > 1 rank: each rank holds only its slice of a per-label classifier table (ASTRA's W, UniDEC's Ψ) and
    # its optimiser state; false = every rank holds the whole table
    shard_label_tables: bool = True
    seed: Seed = 0

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps", v):
            raise ValueError(f"must be auto, cpu, cuda, cuda:<n> or mps (got {v!r})")
        return v

    @model_validator(mode="after")
    def _moments_need_row_adam(self) -> TrainSection:
        if self.sparse_moments != "float32" and self.sparse_optimizer == "torch_sparse_adam":
            raise ValueError(f"sparse_moments {self.sparse_moments} needs sparse_optimizer row_adam or row_adam_torch "
                             "(torch_sparse_adam keeps float32 moments)")
        return self


class TrainAtLeastOneEpoch(TrainSection):
    epochs: PosInt = 1


class DualEncoderConfig(Section):
    encoder: EncoderConfig = EncoderConfig()
    loss: LossConfig = LossConfig()
    negatives: NegativesConfig = NegativesConfig()
    train: TrainAtLeastOneEpoch = TrainAtLeastOneEpoch()


# ------------------------------------------------------------------------------------------------
# RAMEN
class WordnetGraph(Section):
    enabled: bool = True
    hypernym_levels: NonNegInt = 1
    relations: list[str] = []


class RelationsGraph(Section):
    enabled: bool = True


class CooccurrenceGraph(Section):
    enabled: bool | Literal["auto"] = "auto"
    top_k: PosInt = 10
    min_count: PosInt = 2


class DocumentGraph(Section):
    enabled: bool = True
    window: NonNegInt = 2


class WalkConfig(Section):
    walks: PosInt = 8
    hops: PosInt = 400
    restart: Annotated[float, Field(gt=0, le=1)] = 0.8
    top_k: NonNegInt = 3
    min_visits: NonNegInt = 3
    seed: Seed = 0


class GraphConfig(Section):
    source_dir: str | None = None
    wordnet_dir: str | None = None
    wordnet: WordnetGraph = WordnetGraph()
    relations: RelationsGraph = RelationsGraph()
    cooccurrence: CooccurrenceGraph = CooccurrenceGraph()
    document: DocumentGraph = DocumentGraph()
    walk: WalkConfig = WalkConfig()

    @model_validator(mode="after")
    def _wordnet_dir(self) -> GraphConfig:
        if self.source_dir is None and self.wordnet.enabled and not self.wordnet_dir:
            raise ValueError("wordnet.enabled needs wordnet_dir (or give source_dir)")
        return self


class RegulariserConfig(Section):
    sets: list[str] = ["wordnet", "relations", "cooccurrence", "document"]
    query_graph: bool = True
    label_graph: bool = True
    lambda_x: NonNegFloat = 1.0
    lambda_z: NonNegFloat = 1.0
    loss: Literal["triplet", "softmax"] = "triplet"
    margin: NonNegFloat = 0.3
    temperature: PosFloat = 0.05
    label_rows: NonNegInt = 0
    extra_labels: NonNegInt = 0


class PruningConfig(Section):
    enabled: bool = True
    threshold: Annotated[float, Field(ge=-1, le=1)] = 0.0
    warmup_epochs: NonNegInt = 10
    every_epochs: PosInt = 5


class RamenRunConfig(DualEncoderConfig):
    regulariser: RegulariserConfig = RegulariserConfig()
    pruning: PruningConfig = PruningConfig()


# ------------------------------------------------------------------------------------------------
# UniDEC
class UnidecModel(Section):
    dim: Annotated[int, Field(gt=0, le=65536)] = 256
    dropout: DropoutP = 0.1
    dropout_clf: DropoutP | None = None
    init_classifier: Literal["label_text", "random"] = "label_text"
    unseen_classifier: Literal["keep", "zero", "label_text"] = "keep"


class PickSomeLabels(Section):
    OPTIONAL = frozenset({"cluster_every_epochs", "cluster_start_epoch", "encode_batch_size"})
    max_positives_per_query: NonNegInt = 3
    negatives_per_query: NonNegInt = 6
    shortlist_size: Annotated[int, Field(gt=0, le=100_000)] = 30
    refresh_every_epochs: PosInt = 5
    start_epoch: NonNegInt = 0
    cluster_size: PosInt = 16
    cluster_every_epochs: PosInt | None = None     # None: with the shortlist refresh
    cluster_start_epoch: NonNegInt | None = None
    encode_batch_size: PosInt | None = None
    index_kind: IndexKind = "auto"
    positive_sampling: Literal["uniform", "inverse_propensity"] = "uniform"
    propensity_a: PosFloat = 0.55
    propensity_b: PosFloat = 1.5


class UnidecLoss(Section):
    temperature_de: PosFloat = 0.05
    temperature_clf: PosFloat = 0.05
    lam: Prob = 0.5
    lam_de: Prob = 0.5
    lam_clf: Prob = 0.5
    bce_weight: NonNegFloat = 0.0


class UnidecRunConfig(Section):
    encoder: EncoderConfig = EncoderConfig()
    model: UnidecModel = UnidecModel()
    psl: PickSomeLabels = PickSomeLabels()
    loss: UnidecLoss = UnidecLoss()
    train: TrainAtLeastOneEpoch = TrainAtLeastOneEpoch()

    @model_validator(mode="after")
    def _batch(self) -> UnidecRunConfig:
        if self.train.batch_size < self.psl.cluster_size:
            raise ValueError(f"train.batch_size ({self.train.batch_size}) is below psl.cluster_size "
                             f"({self.psl.cluster_size})")
        return self


# ------------------------------------------------------------------------------------------------
# ASTRA
class AstraModel(Section):
    init_classifiers: Literal["label_text", "random"] = "label_text"
    init_scale: PosFloat = 1.0
    bias_init: Any = "prior"   # "prior" (sigma(b) = mean positives per query / L) or a number
    # tau of post-hoc logit adjustment, folded into the bias at the end of training: b_l -= tau * log(1 + n_l)
    logit_adjustment: NonNegFloat = 0.0

    @field_validator("bias_init")
    @classmethod
    def _bias(cls, v: Any) -> Any:
        if v == "prior":
            return v
        try:
            return float(v)
        except (TypeError, ValueError):
            raise ValueError(f"must be 'prior' or a number (got {v!r})") from None


class AstraNegatives(Section):
    OPTIONAL = frozenset({"encode_batch_size", "hnsw_m", "ef_search", "nprobe", "kmeans_iters"})
    max_positives_per_query: NonNegInt = 0
    hard_negatives: NonNegInt = 50
    uniform_negatives: NonNegInt = 400
    start_epoch: NonNegInt = 5
    refresh_every_epochs: PosInt = 5
    mine_with: Literal["classifiers", "label_embeddings"] = "classifiers"
    index_kind: IndexKind = "auto"
    async_refresh: bool = False
    uniform_shared: bool = False      # one uniform draw per batch shared by its queries (a matrix product)
    encode_batch_size: PosInt | None = None
    hnsw_m: Annotated[int, Field(ge=4, le=512)] | None = None
    ef_search: PosInt | None = None
    nprobe: PosInt | None = None
    kmeans_iters: PosInt | None = None   # an IVF mining index's k-means iterations (None: faiss' 10)

    @model_validator(mode="after")
    def _some(self) -> AstraNegatives:
        if self.hard_negatives + self.uniform_negatives == 0:
            raise ValueError("hard_negatives + uniform_negatives must be > 0 (no negatives: nothing to learn from)")
        return self


class AstraRunConfig(Section):
    encoder: EncoderConfig = EncoderConfig()
    model: AstraModel = AstraModel()
    negatives: AstraNegatives = AstraNegatives()
    train: TrainAtLeastOneEpoch = TrainAtLeastOneEpoch()


# ------------------------------------------------------------------------------------------------
# MACLR
class MaclrPairs(Section):
    tfidf_k: Annotated[int, Field(gt=0, le=1000)] = 3
    tfidf_min_score: Annotated[float, Field(ge=-1, le=1)] = 0.0
    names_k: Annotated[int, Field(ge=0, le=1000)] = 3   # label-name matches kept per instance (0 = no names view)
    ict_window: NonNegInt = 1
    title_remove_prob: Prob = 0.9
    seed: Seed = 0


class MaclrStage1(Section):
    mac: bool = True
    label_reg: bool = True
    label_weight: NonNegFloat = 1.0
    label_negatives: NonNegInt = 32
    temperature: PosFloat = 0.05
    k0: PosInt = 110
    t_k: PosInt = 4
    t_update: PosInt = 4
    cluster_pool: NonNegInt = 0
    train: TrainSection = TrainSection()


class MaclrStage2(Section):
    dense_k: NonNegInt = 3
    sparse: bool = True
    sparse_view: Literal["tfidf", "label_names"] = "tfidf"
    sparse_k: PosInt = 3
    select: Literal["union", "agree"] = "union"
    max_instances: NonNegInt = 0
    seed: Seed = 0
    loss: LossConfig = LossConfig()
    negatives: NegativesConfig = NegativesConfig(kind="in_batch", max_positives_per_query=1)
    train: TrainSection = TrainSection()


class MaclrRunConfig(Section):
    encoder: EncoderConfig = EncoderConfig()
    stage1: MaclrStage1 = MaclrStage1()
    stage2: MaclrStage2 = MaclrStage2()


class FewshotRunConfig(Section):
    init: str | None = None
    ratio: Annotated[float, Field(gt=0, le=1)] = 0.01
    seed: Seed = 0
    freeze_embeddings: bool = True
    loss: LossConfig = LossConfig()
    negatives: NegativesConfig = NegativesConfig(kind="in_batch", max_positives_per_query=1)
    train: TrainAtLeastOneEpoch = TrainAtLeastOneEpoch()


# ------------------------------------------------------------------------------------------------
# the rest
class StMnrlRunConfig(Section):
    """The peer's own key; the rest of its settings are the budget run's (``xmc.config.runs``)."""

    budget_of: str


class LabelPriorRunConfig(Section):
    pass


class PretrainedConfig(Section):
    encoder: EncoderConfig = EncoderConfig()


class LabelNamesConfig(Section):
    """Which part of a label text is its name (xmc.lexical.names) and how long a name may be."""

    mode: Literal["auto", "prefix", "identifier", "text"] = "auto"
    max_words: Annotated[int, Field(ge=1, le=8)] = 4
    cased_names: bool = True   # names written with capitals match only that spelling (abbreviations: "He", "Sat")


class NameMatchRunConfig(Section):
    ranking: Literal["zero_shot", "prior"] = "zero_shot"
    label_names: LabelNamesConfig = Field(default_factory=lambda: LabelNamesConfig())


class ValTunedFusionConfig(Section):
    """The validation-tuned fusion: it reads no training pair and is fit on the labelled validation split. ``grid``:
    name-match score + matched_bonus + method_weight x method score, two weights chosen from the grids below;
    ``boosted_trees``: the trees of ``hybrid.boosted_trees`` on the features no training pair gives (the run's
    score, rank and gap, the name matches); ``auto``: whichever of the two has the better cross-fitted validation
    P@k within ``hybrid.max_loss_without_name_match`` (ties: the grid)."""

    fusion: Literal["grid", "boosted_trees", "auto"] = "auto"

    method_weight: Annotated[list[NonNegFloat], Field(min_length=1)] = [0.0, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0,
                                                                       100.0, 1000.0, 1e6]
    matched_bonus: Annotated[list[float], Field(min_length=1)] = [0.0, 10.0, 30.0]
    precision_k: Annotated[int, Field(ge=1, le=100)] = 5   # chosen by validation P@k
    # bonus of the run's first label (in the fusion score's units), chosen as hybrid.first_bonus is; none by
    # default: no point of a grid up to 30 kept the texts without a correct name match within the bound on
    # debian-relations, and the one losing least cost P@1 overall (lab/docs/methods/label_names.md)
    first_bonus: Annotated[list[NonNegFloat], Field(min_length=1)] = [0.0]


class BoostedTreesFusionConfig(Section):
    """The boosted-trees fusion: scikit-learn HistGradientBoostingClassifier settings (binary log-loss)."""

    max_iter: Annotated[int, Field(ge=1, le=5000)] = 200
    learning_rate: PosFloat = 0.1
    max_leaf_nodes: Annotated[int, Field(ge=2, le=1024)] = 15
    min_samples_leaf: Annotated[int, Field(ge=1)] = 50
    l2_regularization: Annotated[float, Field(ge=0)] = 1.0
    early_stopping: bool = True
    validation_fraction: Annotated[float, Field(gt=0, lt=1)] = 0.1
    n_iter_no_change: Annotated[int, Field(ge=1)] = 10


class HybridConfig(Section):
    """How a hybrid re-scores its candidates (a run's top-k ∪ the label-name matches), fit on validation."""

    fusion: Literal["boosted_trees", "logistic"] = "boosted_trees"
    boosted_trees: BoostedTreesFusionConfig = BoostedTreesFusionConfig()
    C: PosFloat = 1.0                 # inverse L2 strength of the logistic fusion
    cross_fit_folds: Annotated[int, Field(ge=2, le=20)] = 2   # validation folds (by document) for honest val metrics
    valtuned: ValTunedFusionConfig = ValTunedFusionConfig()
    # a hybrid whose cross-fitted validation P@k is below its run's keeps the run's ranking (0 = never)
    keep_base_below_k: Annotated[int, Field(ge=0, le=100)] = 5
    monotone: bool = True             # trees keep the direction of a run's score and rank and a name's precision
    name_precision_strength: PosFloat = 2.0   # pseudo-texts shrinking a name's training precision to the mean
    # bonus (log-odds) of the label the run ranks first, chosen by cross-fitted validation P@1
    first_bonus: Annotated[list[NonNegFloat], Field(min_length=1)] = [0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0]
    # the bonus is chosen among those losing at most this many P@1 points against the run on the validation texts
    # with no correct label among their name matches
    max_loss_without_name_match: NonNegFloat = 1.0
    # ... judged only over at least this many such texts: below it one text weighs more than the bound allows
    # (100 / n points), so the bound would trade P@1 on every text for one or two texts; the bonus is then the best P@1
    min_texts_without_name_match: Annotated[int, Field(ge=1)] = 200


class HybridEntry(Section):
    """One hybrid: the run whose candidates it fuses, and how the fusion is fit."""

    base: str
    fusion: Literal["trained", "valtuned"] = "trained"   # valtuned: reads no training pair, two weights tuned on labelled validation


class XrLinearRunConfig(Section):
    """One run of the linear one-vs-all peer (PECOS XR-Linear, ``xmc/peers/xr_linear.py``)."""

    label_embedding: Literal["pifa", "pii"] = "pifa"   # label features for the label tree (PECOS LabelEmbeddingFactory)
    nr_splits: Annotated[int, Field(ge=2, le=1024)] = 16  # children per tree node
    max_leaf_size: PosInt = 100
    threshold: NonNegFloat = 0.1      # weights below this are pruned (sparse models)
    Cp: PosFloat = 1.0                 # cost of positives / negatives in the per-node linear SVMs
    Cn: PosFloat = 1.0
    solver_type: Literal["L2R_L2LOSS_SVC_DUAL", "L2R_LR_DUAL", "L2R_L2LOSS_SVC_PRIMAL", "L2R_LR_PRIMAL"] = \
        "L2R_L2LOSS_SVC_DUAL"
    beam_size: PosInt = 10             # tree nodes kept per level at prediction
    post_processor: Literal["l3-hinge", "sigmoid", "noop", "l2-hinge", "log-sigmoid"] = "l3-hinge"
    seed: Seed = 0
    threads: Annotated[int, Field(ge=-1)] = -1   # -1: every core


class IndexConfig(Section):
    kind: IndexKind = "exact"
    hnsw_m: Annotated[int, Field(ge=4, le=512)] = 32
    ef_search: Annotated[int, Field(gt=0, le=100_000)] = 128
    nprobe: Annotated[int, Field(gt=0, le=100_000)] = 32
    # kind auto: exact up to this many labels, IVF above (xmc.ann.index: cheaper to build than HNSW at 10^6)
    auto_exact_max: Annotated[int, Field(ge=0)] = 200_000
    # vectors held by the index: float16 halves its memory (recall: bench/index_storage.py); auto = float16 for
    # the approximate index chosen above auto_exact_max, float32 otherwise
    storage: Literal["float32", "float16", "auto"] = "auto"
    # an approximate index sets its search width (nprobe / efSearch) to the smallest whose recall@100 against
    # exact search on calibration_sample training queries reaches this (xmc.ann.index.ANNIndex.calibrate);
    # null: the fixed nprobe / ef_search above
    recall_target: Annotated[float, Field(gt=0, le=1)] | None = 0.9
    calibration_sample: Annotated[int, Field(gt=0, le=100_000)] = 1000
    # an approximate index over vectors of unequal norm appends sqrt(M² − ‖v‖²) to each (inner products unchanged)
    equalize_norms: bool = False
    # an IVF/HNSW index slower than brute force at recall_target tries a PQ scan re-ranked exactly before exact
    pq_fallback: bool = True
    encode_batch_size: Annotated[int, Field(gt=0, le=65_536)] = 256
    # above auto_exact_max a dense run may rank only each text's TF-IDF shortlist (xmc.ann.shortlist): off | auto
    # (kept where its validation metric is not significantly below exact search's) | tfidf (always)
    shortlist: Literal["off", "auto", "tfidf"] = "auto"
    # labels shortlisted per text; a list: auto chooses on the validation split (the smallest unless a larger one
    # is significantly better)
    shortlist_k: Annotated[int, Field(gt=0, le=100_000)] | Annotated[list[Annotated[int, Field(gt=0, le=100_000)]],
                                                                   Field(min_length=1)] = [200, 500]
    shortlist_max_postings_per_term: Annotated[int, Field(ge=0)] = 1000
    # validation texts on which the shortlist is compared with exact search over every label (O(labels) each)
    shortlist_decision_texts: Annotated[int, Field(gt=0)] = 2000


class ReportConfig(Section):
    alpha: Annotated[float, Field(gt=0, lt=1)] = 0.05
    paired: list[Annotated[list[str], Field(min_length=2, max_length=2)]] = []
    training_families: dict[str, list[str]] = {}  # figure title -> runs whose training curves share a figure
    # datasets (folder names) whose labelled validation split chose the defaults (the lab's selection): a run that
    # reads no labelled pair is called zero-shot only on the other datasets
    settings_chosen_on: list[str] = []


class OrchestrationConfig(Section):
    retries: Annotated[int, Field(ge=0, le=10)] = 1
    retry_delay_seconds: Annotated[float, Field(ge=0, le=3600)] = 10
    stage_timeout_seconds: Annotated[int, Field(gt=0, le=7 * 24 * 3600)] = 3600
    # stages that may run far longer than stage_timeout_seconds on a GPU worker (paper-length profiles)
    stage_timeouts: dict[str, Annotated[int, Field(gt=0, le=7 * 24 * 3600)]] = {}
    concurrency_limit_name: str = "xmc-dvc-repo"
    concurrency_wait_seconds: Annotated[int, Field(gt=0)] = 6 * 3600
    allowed_paths: list[str] = ["batch"]


class GateConfig(Section):
    # the most (in points) each validation metric may fall below the current holder's before promotion is refused
    max_drop: dict[str, Annotated[float, Field(ge=0, le=100)]] = {"P@1": 0.5, "P@5": 0.5, "PSP@5": 0.5}
    allow_dataset_change: bool = False
    allow_label_set_change: bool = False

    @field_validator("max_drop")
    @classmethod
    def _metrics(cls, v: dict[str, float]) -> dict[str, float]:
        for k in v:
            if not METRIC_RE.match(k):
                raise ValueError(f"{k!r} must look like P@5, nDCG@5, PSP@5, PSnDCG@5 or R@100")
        return v


class RegistryConfig(Section):
    stage: str = "prod"               # the stage label the nightly run promotes to
    promote: list[str] = []           # artifacts the nightly run tries to promote
    serve: str = "#prod"              # what batch prediction and the service load when no model is named
    gate: GateConfig = GateConfig()


class ServeConfig(Section):
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8000
    max_texts: Annotated[int, Field(ge=1, le=100_000)] = 256
    max_chars: Annotated[int, Field(ge=1, le=10_000_000)] = 10_000
    max_k: Annotated[int, Field(ge=1, le=10_000)] = 1000
    batch_size: Annotated[int, Field(ge=1, le=65_536)] = 256
    # a connection that sends nothing (a new one, or a kept-alive one between requests) is closed after this long
    idle_timeout_s: Annotated[float, Field(gt=0, le=3600)] = 5.0
    # open connections at most: one more is closed as soon as it is accepted (a flood of idle connections cannot
    # use up the process's file descriptors)
    max_connections: Annotated[int, Field(ge=1, le=1_000_000)] = 1000


class EncodeCacheConfig(Section):
    dir: str | None = None           # None: off (xmc.encoders.cache)
    min_texts: int = Field(2000, ge=1)
    max_mb: float = Field(1024.0, gt=0)


class ParamsConfig(Section):
    """The product's ``params.yaml``. ``runs`` map a name to a method and its overrides (checked against the
    method's run schema by :mod:`xmc.config.runs`); ``hybrids`` fuse a run with the label names."""

    data: DataConfig
    validate_: ValidateConfig = Field(ValidateConfig(), alias="validate")
    tfidf: TfidfConfig = TfidfConfig()
    label_names: LabelNamesConfig = LabelNamesConfig()
    maclr_pairs: MaclrPairs = MaclrPairs()
    graph: GraphConfig = Field(default_factory=lambda: GraphConfig(wordnet=WordnetGraph(enabled=False)))
    runs: dict[str, dict[str, Any] | None] = {}
    hybrids: dict[str, HybridEntry] = {}
    hybrid: HybridConfig = HybridConfig()
    # the linear peer (PECOS XR-Linear, in its own environment): run name -> its settings ({} = none)
    xr_linear: dict[str, XrLinearRunConfig] = {}
    evaluate: EvaluateConfig = EvaluateConfig()
    index: IndexConfig = IndexConfig()
    encode_cache: EncodeCacheConfig = EncodeCacheConfig()
    report: ReportConfig = ReportConfig()
    orchestration: OrchestrationConfig = OrchestrationConfig()
    registry: RegistryConfig = RegistryConfig()
    serve: ServeConfig = ServeConfig()

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


# ------------------------------------------------------------------------------------------------
# validation with one-line errors
def deep_merge(base: dict[str, Any], override: dict[str, Any] | None) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in (override or {}).items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Field names of the (sub)model at ``loc``, for did-you-mean (empty where it is a free-form dict)."""
    m: Any = model
    for part in loc:
        if not (isinstance(m, type) and issubclass(m, BaseModel)):
            return []
        f = m.model_fields.get(part) or next((x for x in m.model_fields.values() if x.alias == part), None)
        if f is None:
            return []
        ann = f.annotation
        m = next((a for a in getattr(ann, "__args__", ()) if isinstance(a, type) and issubclass(a, BaseModel)), ann)
    if isinstance(m, type) and issubclass(m, BaseModel):
        return [f.alias or n for n, f in m.model_fields.items()]
    return []


def _describe(err: dict[str, Any], model: type[BaseModel]) -> tuple[tuple[Any, ...], str]:
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and ("[" in p or p.startswith("function-"))))
    kind = err["type"]
    if kind == "extra_forbidden":
        *parent, key = loc
        close = difflib.get_close_matches(str(key), _fields_at(model, tuple(parent)), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return loc, f"unknown key{hint}"
    if kind == "missing":
        return loc, "required key is missing"
    msg = err["msg"]
    if kind == "value_error":
        msg = msg.removeprefix("Value error, ")
    got = err.get("input")
    if kind not in ("value_error",) and not isinstance(got, dict | list):
        msg = f"{msg} (got {got!r})"
    return loc, msg


class ParamsError(Exception):
    """A list of (key path, message) found by :func:`validate_params`."""

    def __init__(self, problems: list[tuple[tuple[Any, ...], str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{'.'.join(map(str, p))}: {m}" for p, m in problems))


def _check(model: type[BaseModel], data: Any, prefix: tuple[Any, ...]) -> tuple[BaseModel | None, list]:
    try:
        return model.model_validate(data if data is not None else {}), []
    except ValidationError as e:
        out = []
        for err in e.errors():
            loc, msg = _describe(err, model)
            out.append((prefix + loc, msg))
        return None, out


def filled(model: type[BaseModel], cfg: dict[str, Any] | None, where: str = "") -> dict[str, Any]:
    """``cfg`` (a params section, possibly partial) typed against ``model`` with its defaults filled: what a
    library builder reads, so the defaults live in this schema only. A problem is one ConfigError line per key."""
    validated, errs = _check(model, cfg, ())
    if validated is None:
        prefix = f"{where}." if where else ""
        raise ConfigError("; ".join(f"{prefix}{'.'.join(map(str, loc))}: {msg}" for loc, msg in errs))
    return validated.model_dump()
