from setuptools import find_packages, setup

setup(
    name="elastic-training",
    version="0.1.0",
    description="Elastic, fault-tolerant distributed training: ring collectives, "
                "rendezvous (embedded or etcd), parameter servers with checkpoints.",
    python_requires=">=3.9",
    packages=find_packages(include=["elastic", "elastic.*", "driver", "driver.*",
                                    "rendezvous", "rendezvous.*"]),
    install_requires=[
        "numpy>=1.22",
        "grpcio>=1.50",
        # The etcd v3 client. Its generated code needs the pure-Python protobuf
        # runtime with protobuf >= 4: rendezvous selects it before importing.
        "etcd3>=0.12",
        "protobuf>=3.20",
    ],
    extras_require={
        "mpi": ["mpi4py>=3.1", "mpich"],
        "test": ["pytest>=7", "pytest-timeout>=2.1", "hypothesis>=6",
                 "cryptography>=3.4"],  # test certificates for etcd TLS
        "bench": ["torch==2.13.0"],
    },
    entry_points={
        "console_scripts": [
            "elastic-run=driver.cli:main",
        ],
    },
)
