"""Packaging that pyproject.toml cannot say: the zoo (zoo/ at the repository root, kept there for the
commands in the README and zoo/README.md) ships inside the package as ``outpace/zoo``, so a
non-editable install finds its default model (outpace/zoo.py locates it)."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["outpace*"]), "outpace.zoo"],
    package_dir={"outpace.zoo": "zoo"},
    package_data={"outpace.zoo": ["*.json", "*.md", "*/*"]},
)
