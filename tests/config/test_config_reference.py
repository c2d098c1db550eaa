"""The config reference is generated from the models for every section, components included (issue 23)."""

from __future__ import annotations

from typing import Literal

import yaml
from pydantic import BaseModel, Field

from inferwatch_sidecar.components import registry
from inferwatch_sidecar.components.canary.config import CanaryConfig
from inferwatch_sidecar.config import CoreConfig, SidecarConfig, reference_yaml, undocumented
from inferwatch_sidecar.config.reference import docstring_attributes, field_docs, source_comments


def test_every_field_of_every_section_has_a_description() -> None:
    missing = undocumented()
    assert missing == [], (
        "config fields without a description (give them Field(description=...) or an entry under Attributes: "
        "in their model's docstring): " + ", ".join(missing))


def test_the_root_has_the_daemons_sections_then_one_per_registered_component() -> None:
    fields = list(SidecarConfig.model_fields)
    assert fields == [*CoreConfig.model_fields, *registry.names()]
    for spec in registry.REGISTRY:
        assert SidecarConfig.model_fields[spec.name].annotation is spec.config
    cfg = SidecarConfig.model_validate({"canary": {"baselines": {"m": "v1"}}, "tail": {"enabled": False}})
    assert registry.config_of(cfg, CanaryConfig).baselines == {"m": "v1"}
    assert registry.section(cfg, "tail").model_dump()["enabled"] is False


def test_the_reference_reads_back_as_the_defaults_of_every_section() -> None:
    ref = yaml.safe_load(reference_yaml())
    want = SidecarConfig().model_dump(mode="json")
    # Shown otherwise on purpose: octal permissions as written in a file, a mode its validator resolves.
    assert ref["ingest"].pop("socket_mode") == "0666" and want["ingest"].pop("socket_mode") == 0o666
    assert ref["drift"].pop("reference_mode") is None and want["drift"].pop("reference_mode") == "warmup"
    assert ref == want
    assert set(ref) == {*CoreConfig.model_fields, *registry.names()}


def test_the_reference_carries_the_component_docstrings_and_list_items() -> None:
    text = reference_yaml()
    assert "\ntail:\n  # Build the tail component.\n  enabled: true\n" in text
    # An entry naming two fields documents both; a list of models shows its item's fields.
    assert text.count("# Float tolerance of a match") == 2
    assert "  # Each item:\n  #   url: The engine's Prometheus endpoint (http or https). (required)\n" in text
    assert "  atol: 1.0e-09\n" in text  # YAML 1.1 reads 1e-09 as a string


class _Inner(BaseModel):
    """An inner section."""

    x: int = 1


class _Toy(BaseModel):
    """A model written the three ways the generator reads.

    Attributes:
        a / b: shared
            across two lines.
        c, d: also shared.
        nested: the inner section.
    Raises:
        e: not an attribute (another section).
    """

    a: int = 0
    b: int = 0
    c: int = 0
    d: int = 0
    #: From a comment
    #: of two lines.
    e: int = 0
    f: int = Field(0, description="From the field.")
    nested: _Inner = Field(default_factory=_Inner)
    items: list[_Inner] = Field(default_factory=list)
    bare: Literal["x", "y"] = "x"


def test_descriptions_come_from_the_field_the_docstring_and_comments() -> None:
    assert docstring_attributes(_Toy) == {"a": "shared across two lines.", "b": "shared across two lines.",
                                          "c": "also shared.", "d": "also shared.", "nested": "the inner section."}
    assert source_comments(_Toy) == {"e": "From a comment of two lines."}
    docs = field_docs(_Toy)
    assert docs["f"] == "From the field." and docs["e"] == "From a comment of two lines."
    assert docs["nested"] == "The inner section."
    assert "items" not in docs and "bare" not in docs  # a list of models needs words of its own


def test_the_check_names_each_undocumented_field_by_its_path() -> None:
    class Root(BaseModel):
        toy: _Toy = Field(default_factory=_Toy, description="The toy.")

    assert undocumented(Root) == [f"toy.nested.x ({__name__}._Inner)", f"toy.items ({__name__}._Toy)",
                                  f"toy.bare ({__name__}._Toy)"]
