"""A Jupyter notebook, run by a real kernel (ipykernel, driven by nbclient) of this very
interpreter: a cell defines the Dataset class, another iterates it with num_workers=2 for 2
epochs. Prints what the cells printed."""

import json
import os
import sys
import tempfile

import nbformat
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient

CELLS = [
    "import sys\nprint(sys.executable)",
    """\
import os

import torch
from torch.utils.data import Dataset

if os.environ.get("LOADER") == "async":
    from asyncloader import AsyncLoader as Loader
else:
    from torch.utils.data import DataLoader as Loader""",
    """\
class Squares(Dataset):
    def __len__(self):
        return 18

    def __getitem__(self, i):
        return torch.tensor([i, i * i])""",
    """\
loader = Loader(Squares(), batch_size=4, num_workers=2)
for epoch in range(2):
    for batch in loader:
        print(epoch, batch.tolist())""",
]


def kernel_manager(kernels):
    """A manager for kernel "python3" that runs `sys.executable -m ipykernel_launcher`,
    whatever other kernel specs the machine has."""
    spec = os.path.join(kernels, "python3")
    os.makedirs(spec)
    with open(os.path.join(spec, "kernel.json"), "w") as f:
        argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        json.dump({"argv": argv, "display_name": "Python 3", "language": "python"}, f)
    specs = KernelSpecManager(kernel_dirs=[kernels])
    return KernelManager(kernel_name="python3", kernel_spec_manager=specs)


def main():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in CELLS]
    with tempfile.TemporaryDirectory() as tmp:
        km = kernel_manager(os.path.join(tmp, "kernels"))
        try:
            client = NotebookClient(
                nb, km=km, timeout=90, resources={"metadata": {"path": os.getcwd()}}
            )
            client.execute()
        finally:
            if km.has_kernel:
                km.shutdown_kernel()
    printed = [
        "".join(out["text"] for out in cell.outputs if out.get("name") == "stdout")
        for cell in nb.cells
    ]
    if printed[0].strip() != sys.executable:
        sys.exit(f"the kernel ran {printed[0].strip()}, not {sys.executable}")
    print("".join(printed[1:]), end="")


if __name__ == "__main__":
    main()
