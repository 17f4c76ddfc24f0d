"""The benchmark lab: what the campaigns under ``benchmarks/`` share and the package does not
ship (stand-alone reference trainings and their packed results). The scripts import it as
``frugalnas_lab`` (their folder is on ``sys.path`` when run as ``python benchmarks/NAME.py``);
``tests/benchmarks/conftest.py`` puts that folder on the path for the tests."""
