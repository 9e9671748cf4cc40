"""lion_jax: LION and linear-attention sequence models in JAX/Flax, with Pallas GPU kernels."""

from setuptools import find_packages, setup

setup(
    name="lion_jax",
    version="0.1.0",
    description=(
        "LION (bidirectional linear attention), Lightning Attention/TNL, LightNet and linear LMs "
        "in JAX/Flax with Pallas GPU kernels"
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.12",
    packages=find_packages(include=["lion_jax", "lion_jax.*", "pallas_kernels", "pallas_kernels.*",
                                    "experiments", "experiments.*", "configs", "configs.*"]),
    install_requires=[
        "jax>=0.11.2",
        "flax>=0.12",
        "optax>=0.2.8",
        "orbax-checkpoint>=0.12",
        "chex>=0.1.90",
        "ml-collections>=1.0",
        "numpy>=1.26",
        "scipy>=1.11",  # lion_jax.scaling.fit (imported directly; jax needs it too)
        "tqdm>=4.66",
        "tokenizers>=0.20",  # WordPiece for the MLM data (encode_batch_fast: 0.20)
    ],
    extras_require={
        # jax-linear-attention: the jla peer of experiments.bench_kernels (its rows are tested)
        # scikit-learn: the GLUE metrics are checked against sklearn.metrics
        "test": ["pytest>=8", "pytest-xdist>=3.5", "pillow>=10", "matplotlib>=3.8",
                 "jax-linear-attention>=0.1.0", "scikit-learn>=1.4"],
        "data": ["tensorflow-datasets>=4.9", "tensorflow-cpu>=2.16", "pillow>=10"],
        "gpu": ["jax[cuda13]>=0.11.2", "matplotlib>=3.8", "torch>=2.5", "fla-core>=0.6.0",
                "jax-linear-attention>=0.1.0"],
        "notebooks": ["jupyter", "matplotlib>=3.8"],
    },
    classifiers=[
        "Programming Language :: Python :: 3.12",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
