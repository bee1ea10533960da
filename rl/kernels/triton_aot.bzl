"""triton_aot: compiles every Triton kernel listed in rl/kernels/triton/aot_specs.py ahead of time for one CUDA
architecture, on a machine without a GPU, into NAME.smARCH.cubin and NAME.smARCH.ptx build outputs."""

def _triton_aot_impl(ctx):
    outputs = []
    for kernel in ctx.attr.kernels:
        for ext in ("cubin", "ptx"):
            outputs.append(ctx.actions.declare_file("{}/{}.sm{}.{}".format(ctx.label.name, kernel, ctx.attr.arch, ext)))
    args = ctx.actions.args()
    args.add("--arch", str(ctx.attr.arch))
    args.add("--out_dir", outputs[0].dirname)
    args.add_all("--expect", ctx.attr.kernels)
    ctx.actions.run(
        executable = ctx.executable.compiler,
        arguments = [args],
        outputs = outputs,
        mnemonic = "TritonAot",
        progress_message = "Triton AOT sm_{} ({} kernels)".format(ctx.attr.arch, len(ctx.attr.kernels)),
        env = {"HOME": "/tmp"},
    )
    return [DefaultInfo(files = depset(outputs))]

triton_aot = rule(
    implementation = _triton_aot_impl,
    attrs = {
        "arch": attr.int(mandatory = True, doc = "compute capability as an integer: 80, 90"),
        "kernels": attr.string_list(mandatory = True, doc = "KernelSpec names; must match aot_specs.SPECS"),
        "compiler": attr.label(
            default = "//rl/kernels/aot:triton_aot_compile",
            executable = True,
            cfg = "exec",
        ),
    },
    doc = "Triton kernels compiled with triton.compile(ASTSource, target=GPUTarget('cuda', arch, 32)).",
)
