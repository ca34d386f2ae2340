from setuptools import find_packages, setup

setup(
    name="nanospa",
    version="0.1.0",
    description="Deep transformers without shortcuts (E-SPA, U-SPA, Value-SkipInit, DKS/TAT) "
                "on a hand-written NumPy/CuPy autograd",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=find_packages(include=["nanospa", "nanospa.*"]),
    py_modules=["data"],   # train.py and sample.py are commands run from the checkout, as in nanoGPT
    install_requires=["numpy>=1.24", "tqdm"],
    extras_require={
        "gpu": ["cupy-cuda12x"],    # CuPy's wheel for CUDA 12 drivers; cupy-cuda11x / cupy-cuda13x for others (README)
        "plot": ["matplotlib"],
        "test": ["pytest"],
        "mpi": ["mpi4py>=4.1", "mpich"],   # data parallelism over processes; mpich's wheel brings mpiexec
        "bpe": ["tokenizers"],      # --tokenizer=bpe:N: Hugging Face's byte-level BPE (nanospa/run/tokenizer.py)
    },
)
