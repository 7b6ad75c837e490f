# fp8ref — the commands:
#   make demo   build, then run the built-in demo (today: one value through every convention; grows into
#               golden -> run -> diff on the smoke suite)
#   make test   build and run every test (unit, hardware captures, exhaustive sweeps, Python interop), then
#               `make sanitize`
#   make sanitize  the unit tests under ASan+UBSan and each libFuzzer target for 20 s, in a second build
#               directory (build-asan, clang++)
# All install what is missing first (Debian packages, then PyPI packages) and are fast when already set up.

BUILD     ?= build
ASAN_BUILD ?= build-asan
JOBS      ?= $(shell nproc)
PYTHON    ?= python3
APT_PKGS  := cmake g++ make pkg-config libhwy-dev libeigen3-dev libdnnl-dev doctest-dev nlohmann-json3-dev zlib1g-dev python3 python3-pip \
             clang libclang-rt-14-dev libomp-dev
PIP_PKGS  := numpy ml_dtypes pytest safetensors
SUDO      := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all demo test sanitize deps deps-apt deps-pip configure build bench clean

all: build

deps: deps-apt deps-pip

deps-apt:
	@missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi

deps-pip:
	@$(PYTHON) -c "import numpy, ml_dtypes, pytest, safetensors" 2>/dev/null || { \
	  echo "installing Python packages: $(PIP_PKGS)"; \
	  $(PYTHON) -m pip install -q $(PIP_PKGS) 2>/dev/null || \
	  $(PYTHON) -m pip install -q --break-system-packages $(PIP_PKGS); }

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE=$$(command -v $(PYTHON)) >/dev/null

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	./$(BUILD)/fp8ref demo

test: build
	cd $(BUILD) && OMP_WAIT_POLICY=passive ctest --output-on-failure
	@$(MAKE) --no-print-directory sanitize

# ASan+UBSan and libFuzzer (cmake/sanitize.cmake, tests/fuzz): clang++ with its libFuzzer runtime (libclang-rt-14-dev)
# and OpenMP runtime (libomp-dev). Runs the "unit" and "fuzz" labels; the exhaustive sweeps stay in $(BUILD).
$(ASAN_BUILD)/CMakeCache.txt:
	CC=clang CXX=clang++ cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DFP8REF_SANITIZE=ON -DFP8REF_FUZZ=ON \
	  -DFP8REF_BUILD_BENCH=OFF -DPython3_EXECUTABLE=$$(command -v $(PYTHON)) >/dev/null

sanitize: deps $(ASAN_BUILD)/CMakeCache.txt
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && OMP_WAIT_POLICY=passive UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest -L 'unit|fuzz' -j $(JOBS) --output-on-failure

bench: build
	./$(BUILD)/bench/bench_convert

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
