"""The demo's model: a seeded synthetic dataset and a softmax regression fit with numpy.

The data imitate a small credit-decision service: eight numeric features, one
categorical feature (``region``) and three classes. Labels come from a hidden
"true" linear model plus sampling noise, so the trained model is good but not
perfect and its confidences are roughly calibrated (which the label-free
accuracy estimate relies on).

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


def sample(n: int, rng: np.random.Generator, *, drift: bool = False, seed: int = 0) -> Batch:
    """Draw ``n`` rows with labels from the healthy (or drifted) distribution.

    Args:
        n: rows.
        rng: the random generator (the caller owns the seed).
        drift: shift :data:`DRIFT_SHIFT` features and the region mix.
        seed: the dataset seed, which fixes the hidden labelling model.
    """
    z = rng.standard_normal((n, len(NUMERIC)))
    if drift:
        for j, name in enumerate(NUMERIC_NAMES):
            z[:, j] += DRIFT_SHIFT.get(name, 0.0)
    mu = np.array([m for m, _ in NUMERIC.values()])
    sd = np.array([s for _, s in NUMERIC.values()])
    numeric = mu + sd * z
    p = DRIFT_REGION_P if drift else REGION_P
    ridx = rng.choice(len(REGIONS), size=n, p=p)
    w, b = _true_weights(seed)
    logits = _design(z, ridx) @ w + b
    # Labels are sampled from the hidden model's probabilities: realistic noise, calibrated signal.
    probs = _softmax(logits * 1.5)
    u = rng.random(n)[:, None]
    lab = (probs.cumsum(axis=1) < u).sum(axis=1).clip(0, len(CLASSES) - 1)
    return Batch(numeric, [REGIONS[i] for i in ridx], [CLASSES[i] for i in lab])


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
        """Class probabilities, shape (n, 3). ``temperature`` > 1 flattens them (the confidence-drop fault)."""
        return _softmax((self.design(numeric, region) @ self.w + self.b) / temperature)

    def predict(self, numeric: np.ndarray, region: list[str], temperature: float = 1.0) -> tuple[list[str], np.ndarray]:
        """Predicted class names and their confidences."""
        p = self.predict_proba(numeric, region, temperature)
        k = p.argmax(axis=1)
        return [CLASSES[i] for i in k], p[np.arange(len(k)), k]

    def canary(self) -> Model:
        """The canary version: same weights, shifted class biases (a different prediction mix)."""
        return replace(self, b=self.b + np.array(CANARY_BIAS), version=CANARY)


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

    Returns:
        A short description: rows, columns and the training accuracy.
    """
    # Imported here: the model servers (the Triton one runs in PyTriton's own Python, without scipy) need
    # only numpy.
    from inferwatch_sidecar.components.drift import profile as prof

    model, data = train(seed)
    numeric, categorical = reference_columns(model, data)
    order = [*NUMERIC_NAMES, CATEGORICAL_NAME, "prediction", "confidence"]
    p = prof.build(numeric, categorical, prediction="prediction", confidence="confidence",
                   source=f"inferwatch demo training data (seed {seed})", order=order)
    p.save(path)
    pred = categorical["prediction"]
    acc = float(np.mean([a == b for a, b in zip(pred, data.label, strict=True)]))
    return {"rows": len(data), "columns": len(order), "train_accuracy": acc,
            "confidence_mean": float(numeric["confidence"].mean())}
