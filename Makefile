# Packaging entry points (see packaging/README.md). The Python project itself installs with pip (README.md).
VARIANT ?= cpu
PKG_VENV ?= build/venv-$(VARIANT)
PYTHON ?= python3
export VARIANT PKG_VENV PYTHON

.PHONY: package test-install bench-package clean-package

## package: the PyInstaller bundle, the .deb and the .tar.gz in dist/ (VARIANT=gpu for the GPU build)
package:
	packaging/build.sh

## test-install: install the .deb on this machine, run hearth --self-test, remove it, check nothing is left (root)
test-install:
	packaging/test-install.sh

## bench-package: sizes and cold start of the installed build → bench/results/package.json (root: installs the
## .deb for the measurement and removes it; the source-tree comparison runs on the dev venv's Python)
BENCH_PYTHON ?= .venv/bin/python
BENCH_ARGS ?= --install
bench-package:
	$(BENCH_PYTHON) bench/package.py $(BENCH_ARGS)

clean-package:
	rm -rf build/pyinstaller-* build/deb build/tar build/icons build/model-* dist/pyinstaller dist/hearth*.deb dist/hearth*.tar.gz
