# Sourced on the GPU machine from the project's root, before `source .whl/install_on_device.sh`, where the
# session's device time counts (the 5-seed sweep must fit in one session with its install, docs/benchmarks.md):
# the same /tmp/site (the carried wheels and fairseq-fixed), made faster, so that the shared script then finds
# fairseq there and only exports PYTHONPATH and PATH. fairseq-fixed's Python tree is copied from its sdist as it is
# and only its three Cython / C++ extensions are compiled (in a copy of the tree, at once), then copied in; its
# three torch C++ extensions (libbase, libnat, alignment_train_cpu_binding: non-autoregressive models and alignment
# training, which this plugin never loads) are not built, and no wheel is made of it. fairseq imports the three only
# where it uses them, so the check that fairseq and torch import (about 10 s, mostly torch's first import) runs
# beside the build (about 13 s) instead of after it. Prints each stage's seconds; $site/.installed marks the end.
#
#   device tool: carry [".whl", ...]; command: source benchmarks/install_quick.sh && source .whl/install_on_device.sh
install_quick() {
    local site=${INSTALL_SITE:-/tmp/site} tools=/tmp/build_tools src=/tmp/fairseq_src began=$SECONDS stage
    if [ -e "$site/.installed" ]; then
        echo "install: $site has fairseq already"
        return 0
    fi
    local sdist=(.whl/fairseq_fixed-*.tar.gz)
    [ -e "${sdist[0]}" ] || {
        echo "install: no fairseq-fixed sdist in .whl/ (run shared/gpu/prepare_wheels.sh)"; return 1; }
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" .whl/*.whl \
        > /tmp/install_wheels.log 2>&1 &
    local wheels=$!
    rm -rf "$src" && mkdir -p "$src" && tar xzf "${sdist[0]}" -C "$src" --strip-components=1 || return 1
    stage=$SECONDS
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$tools" .whl/[Cc]ython-*.whl \
        .whl/setuptools-*.whl || return 1
    echo "install: the build's tools (Cython, setuptools) in $(( SECONDS - stage )) s"
    stage=$SECONDS
    ( cd "$src" && PYTHONPATH=$tools python3 - <<'EOF'
import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

flags = ["-std=c++11", "-O3"]  # fairseq-fixed's setup.py's, on Linux
extensions = [
    Extension("fairseq.libbleu", ["fairseq/clib/libbleu/libbleu.cpp", "fairseq/clib/libbleu/module.cpp"],
              extra_compile_args=flags),
    Extension("fairseq.data.data_utils_fast", ["fairseq/data/data_utils_fast.pyx"], language="c++",
              include_dirs=[numpy.get_include()], extra_compile_args=flags),
    Extension("fairseq.data.token_block_utils_fast", ["fairseq/data/token_block_utils_fast.pyx"], language="c++",
              include_dirs=[numpy.get_include()], extra_compile_args=flags),
]
setup(name="fairseq-extensions", ext_modules=cythonize(extensions, quiet=True),
      script_args=["-q", "build_ext", "--inplace", "--parallel", str(len(extensions))])
EOF
    ) > /tmp/install_build.log 2>&1 &
    local build=$!
    wait $wheels || { echo "install: the wheels' install failed: /tmp/install_wheels.log"; kill $build; return 1; }
    echo "install: the wheels installed, $(( SECONDS - stage )) s after the build's start"
    # the Python tree (the build adds only its three modules, copied in below once built)
    rm -rf "$site/fairseq" "$site/fairseq_cli" && cp -a "$src/fairseq" "$src/fairseq_cli" "$site"/ &&
        cp -a "$src/examples" "$site/fairseq/examples" || { kill $build; return 1; }  # fairseq.examples, as the wheel
    PYTHONPATH=$site python3 -c "import fairseq, torch" || {
        echo "install: fairseq does not import"; kill $build; return 1; }
    echo "install: fairseq copied and imported (torch with it) $(( SECONDS - stage )) s after the build's start"
    wait $build || { echo "install: building fairseq's extensions failed: /tmp/install_build.log"
                     tail -5 /tmp/install_build.log; return 1; }
    (cd "$src" && find fairseq -name '*.so' -exec cp {} "$site"/{} \;) || return 1
    echo "install: fairseq's Cython / C++ extensions built and copied in $(( SECONDS - stage )) s;" \
        "$(( SECONDS - began )) s in all"
    touch "$site/.installed"
}
install_quick
