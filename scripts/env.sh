# Sourced by the scripts: the toolchain paths the build needs (bpf-linker against LLVM 22).
export PATH="/usr/lib/llvm-22/bin:$HOME/.cargo/bin:$PATH"
export LLVM_SYS_221_PREFIX=/usr/lib/llvm-22
