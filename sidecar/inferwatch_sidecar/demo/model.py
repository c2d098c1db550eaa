"""The demo's model: a seeded synthetic dataset and a softmax regression fit with numpy.

The data imitate a small credit-decision service: eight numeric features, one
categorical feature (``region``) and three classes. Labels come from a hidden
"true" linear model plus sampling noise, so the trained model is good but not
perfect. It is served **overconfident** (its logits times
:data:`OVERCONFIDENCE`, as a gradient-boosted model is): mean confidence 0.98
at an accuracy of 0.87, so the mean confidence is a poor accuracy estimate and
the reference profile carries a calibration fitted on the labelled training
data (CBPE-style, :mod:`~inferwatch_sidecar.components.drift.performance`).

The confidence fault sends inputs from a *hard segment*: applicants near the
hidden model's decision boundary (its top class probability below
:data:`HARD_MAX_P`). Labels still come from the hidden model, so this is a
covariate shift: accuracy falls to about 0.63, the overconfident model's mean
confidence only to about 0.94, and the calibrated estimate follows the
accuracy.

Everything is deterministic for a given seed: every model-server worker trains
the same model at start-up, and the scenario runner trains it once more to
build the reference profile, without sharing a file.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

#: The model's name, and the versions the stable and canary servers serve.
NAME = "credit-risk"
STABLE, CANARY = "v1", "v2"

#: Numeric features: name -> (mean, standard deviation) of the healthy distribution.
NUMERIC: dict[str, tuple[float, float]] = {
    "age": (41.0, 12.0),
    "income": (58.0, 18.0),
    "debt_ratio": (0.35, 0.12),
    "tenure_months": (48.0, 20.0),
    "num_accounts": (4.0, 1.5),
    "utilization": (0.42, 0.15),
    "late_payments": (0.8, 0.7),
    "inquiries": (1.5, 0.9),
}
NUMERIC_NAMES: tuple[str, ...] = tuple(NUMERIC)
#: The categorical feature and its healthy distribution.
REGIONS: tuple[str, ...] = ("north", "south", "east", "west")
REGION_P: tuple[float, ...] = (0.4, 0.3, 0.2, 0.1)
CATEGORICAL_NAME = "region"
CLASSES: tuple[str, ...] = ("approve", "review", "decline")

#: Feature drift: these features move by this many standard deviations, and regions follow DRIFT_REGION_P.
DRIFT_SHIFT: dict[str, float] = {
    "income": -1.2, "debt_ratio": 1.2, "utilization": 1.0, "tenure_months": -1.0, "inquiries": 1.0,
}
DRIFT_REGION_P: tuple[float, ...] = (0.1, 0.2, 0.2, 0.5)
#: The canary model's class-bias offsets: it declines more and approves less.
CANARY_BIAS: tuple[float, ...] = (-3.5, 0.0, 3.5)
#: The served model's logits are multiplied by this: it is overconfident (the predicted classes do not change).
OVERCONFIDENCE = 10.0
#: The hard segment of the confidence fault: rows whose hidden top-class probability is below this.
HARD_MAX_P = 0.8


@dataclass(frozen=True)
class Batch:
    """Rows of inputs with their true labels.

    Attributes:
        numeric: shape (n, 8), columns in :data:`NUMERIC_NAMES` order.
        region: n region names.
        label: n true class names.
    """

    numeric: np.ndarray
    region: list[str]
    label: list[str]

    def __len__(self) -> int:
        return len(self.region)

    def row(self, i: int) -> dict[str, Any]:
        """Row ``i`` as the JSON features the model server accepts."""
        d: dict[str, Any] = {n: round(float(v), 4) for n, v in zip(NUMERIC_NAMES, self.numeric[i], strict=True)}
        d[CATEGORICAL_NAME] = self.region[i]
        return d


def _true_weights(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed + 7919)
    w = rng.normal(0.0, 1.0, size=(len(NUMERIC) + len(REGIONS), len(CLASSES)))
    w[:, 0] -= w[:, 0].mean()
    b = np.array([0.6, 0.0, -0.4])
    return w, b


def sample(n: int, rng: np.random.Generator, *, drift: bool = False, hard: float = 0.0, seed: int = 0) -> Batch:
    """Draw ``n`` rows with labels from the healthy (or drifted) distribution.

    Args:
        n: rows.
        rng: the random generator (the caller owns the seed).
        drift: shift :data:`DRIFT_SHIFT` features and the region mix.
        hard: share of the rows drawn from the hard segment (the confidence fault): rows of the same
            distribution whose hidden top-class probability is below :data:`HARD_MAX_P`.
        seed: the dataset seed, which fixes the hidden labelling model.
    """
    z, ridx, probs = _draw(n, rng, drift, seed)
    k = int(rng.binomial(n, hard)) if hard > 0 else 0
    parts = [(z[k:], ridx[k:], probs[k:])]
    while k > 0:
        hz, hr, hp = _draw(4 * k, rng, drift, seed)
        keep = np.flatnonzero(hp.max(axis=1) < HARD_MAX_P)[:k]
        parts.append((hz[keep], hr[keep], hp[keep]))
        k -= keep.size
    if len(parts) > 1:
        order = rng.permutation(n)
        z = np.vstack([p[0] for p in parts])[order]
        ridx = np.concatenate([p[1] for p in parts])[order]
        probs = np.vstack([p[2] for p in parts])[order]
    mu = np.array([m for m, _ in NUMERIC.values()])
    sd = np.array([s for _, s in NUMERIC.values()])
    # Labels are sampled from the hidden model's probabilities: realistic noise, calibrated signal.
    u = rng.random(n)[:, None]
    lab = (probs.cumsum(axis=1) < u).sum(axis=1).clip(0, len(CLASSES) - 1)
    return Batch(mu + sd * z, [REGIONS[i] for i in ridx], [CLASSES[i] for i in lab])


def _draw(n: int, rng: np.random.Generator, drift: bool, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Standardized numeric inputs, region indices and the hidden model's class probabilities of ``n`` rows."""
    z = rng.standard_normal((n, len(NUMERIC)))
    if drift:
        for j, name in enumerate(NUMERIC_NAMES):
            z[:, j] += DRIFT_SHIFT.get(name, 0.0)
    p = DRIFT_REGION_P if drift else REGION_P
    ridx = rng.choice(len(REGIONS), size=n, p=p)
    w, b = _true_weights(seed)
    return z, ridx, _softmax((_design(z, ridx) @ w + b) * 1.5)


def _design(z: np.ndarray, ridx: np.ndarray) -> np.ndarray:
    onehot = np.zeros((len(ridx), len(REGIONS)))
    onehot[np.arange(len(ridx)), ridx] = 1.0
    return np.hstack([z, onehot])


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@dataclass(frozen=True)
class Model:
    """A softmax regression over standardized numeric features and one-hot regions.

    Attributes:
        mean, std: training statistics of the numeric features.
        w: weights, shape (8 + 4, 3).
        b: class biases.
        version: the model version it serves as.
    """

    mean: np.ndarray
    std: np.ndarray
    w: np.ndarray
    b: np.ndarray
    version: str = STABLE

    def design(self, numeric: np.ndarray, region: list[str]) -> np.ndarray:
        z = (np.asarray(numeric, dtype=np.float64) - self.mean) / self.std
        ridx = np.array([REGIONS.index(r) if r in REGIONS else 0 for r in region], dtype=np.int64)
        return _design(z, ridx)

    def predict_proba(self, numeric: np.ndarray, region: list[str], temperature: float = 1.0) -> np.ndarray:
        """Class probabilities, shape (n, 3), overconfident by :data:`OVERCONFIDENCE`.

        ``temperature`` > 1 flattens them (``confidence_temperature`` of the fault file, a manual knob).
        """
        return _softmax((self.design(numeric, region) @ self.w + self.b) * (OVERCONFIDENCE / temperature))

    def predict(self, numeric: np.ndarray, region: list[str], temperature: float = 1.0) -> tuple[list[str], np.ndarray]:
        """Predicted class names and their confidences."""
        p = self.predict_proba(numeric, region, temperature)
        k = p.argmax(axis=1)
        return [CLASSES[i] for i in k], p[np.arange(len(k)), k]

    def canary(self) -> Model:
        """The faulty canary version: same weights, shifted class biases (a different prediction mix)."""
        return replace(self, b=self.b + np.array(CANARY_BIAS), version=CANARY)

    def healthy_canary(self) -> Model:
        """The canary version before its fault: the stable model released as :data:`CANARY`."""
        return replace(self, version=CANARY)


def train(seed: int = 0, n: int = 5000, iterations: int = 150, lr: float = 1.0, l2: float = 1e-3) -> tuple[Model, Batch]:
    """Fit the stable model on ``n`` generated rows; returns the model and its training data.

    Full-batch gradient descent on the cross-entropy; well under a second.
    """
    rng = np.random.default_rng(seed)
    data = sample(n, rng, seed=seed)
    mean = data.numeric.mean(axis=0)
    std = data.numeric.std(axis=0)
    model = Model(mean, std, np.zeros((len(NUMERIC) + len(REGIONS), len(CLASSES))), np.zeros(len(CLASSES)))
    x = model.design(data.numeric, data.region)
    y = np.zeros((n, len(CLASSES)))
    y[np.arange(n), [CLASSES.index(c) for c in data.label]] = 1.0
    w, b = model.w.copy(), model.b.copy()
    for _ in range(iterations):
        g = _softmax(x @ w + b) - y
        w -= lr * (x.T @ g / n + l2 * w)
        b -= lr * g.mean(axis=0)
    return replace(model, w=w, b=b), data


def reference_columns(model: Model, data: Batch) -> tuple[dict[str, np.ndarray], dict[str, list[Any]]]:
    """The reference table: features plus the model's ``prediction`` and ``confidence`` on them."""
    pred, conf = model.predict(data.numeric, data.region)
    numeric = {name: data.numeric[:, j].copy() for j, name in enumerate(NUMERIC_NAMES)}
    numeric["confidence"] = conf
    categorical: dict[str, list[Any]] = {CATEGORICAL_NAME: list(data.region), "prediction": pred}
    return numeric, categorical


def build_reference(path: str, seed: int = 0) -> dict[str, Any]:
    """Train the model and write its reference profile (the drift package's builder) to ``path``.

    The training data's labels calibrate the label-free accuracy estimate (what ``inferwatch reference
    build ... --label label`` does for a file): the profile stores P(correct | confidence) and the
    realized accuracy.

    Returns:
        A short description: rows, columns, the training accuracy and mean confidence, and the calibration.
    """
    # Imported here: the model servers (the Triton one runs in PyTriton's own Python, without scipy) need
    # only numpy.
    from inferwatch_sidecar.components.drift import performance
    from inferwatch_sidecar.components.drift import profile as prof

    model, data = train(seed)
    numeric, categorical = reference_columns(model, data)
    order = [*NUMERIC_NAMES, CATEGORICAL_NAME, "prediction", "confidence"]
    p = prof.build(numeric, categorical, prediction="prediction", confidence="confidence",
                   source=f"inferwatch demo training data (seed {seed})", order=order)
    p.performance = performance.fit(categorical["prediction"], numeric["confidence"], data.label, label="label")
    p.save(path)
    return {"rows": len(data), "columns": len(order), "train_accuracy": p.performance.reference_accuracy,
            "confidence_mean": float(numeric["confidence"].mean()), "calibration": p.performance.calibration.method}
