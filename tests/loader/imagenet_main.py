"""A training script written the way pytorch/examples' ``imagenet/main.py`` is, cut to what runs on 2 CPUs.

Its data path is main.py's, line for line: ``import torchvision.datasets as datasets``,
``os.path.join(args.data, 'train')`` and ``'val'``, ``datasets.ImageFolder(traindir, ...)``,
``DistributedSampler`` (``set_epoch`` every epoch), ``mp.spawn`` of one process per device with
``--multiprocessing-distributed``, and main.py's validation over the ranks (a ``drop_last`` sampler,
then the samples it left out, ``aux_val_loader``), its counts summed with ``all_reduce``. The model
is small and the device the CPU (gloo), where main.py takes ``--arch`` on GPUs (nccl).
``tests/loader/test_imagenet_example.py`` runs it as it is on the source tree, and with its import
changed to ``import imgshards.loader.torchvision_datasets as datasets`` on the packed one.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.utils.data
import torch.utils.data.distributed
import torchvision.datasets as datasets
import torchvision.transforms as transforms
from torch.utils.data import Subset

parser = argparse.ArgumentParser(description="PyTorch ImageNet Training")
parser.add_argument("data", metavar="DIR", help="path to dataset")
parser.add_argument("-j", "--workers", default=2, type=int, metavar="N", help="data loading workers")
parser.add_argument("--epochs", default=2, type=int, metavar="N", help="number of total epochs to run")
parser.add_argument("-b", "--batch-size", default=8, type=int, metavar="N", help="mini-batch size")
parser.add_argument("--lr", "--learning-rate", default=0.1, type=float, metavar="LR", dest="lr")
parser.add_argument("--world-size", default=-1, type=int, help="number of nodes for distributed training")
parser.add_argument("--rank", default=-1, type=int, help="node rank for distributed training")
parser.add_argument("--dist-url", default="tcp://127.0.0.1:23456", type=str, help="url of the process group")
parser.add_argument("--dist-backend", default="gloo", type=str, help="distributed backend")
parser.add_argument("--multiprocessing-distributed", action="store_true", help="one process per device")
parser.add_argument("--procs-per-node", default=2, type=int, help="processes per node (main.py: GPUs)")


def main():
    args = parser.parse_args()
    args.distributed = args.world_size > 1 or args.multiprocessing_distributed
    ngpus_per_node = args.procs_per_node
    if args.multiprocessing_distributed:
        args.world_size = ngpus_per_node * args.world_size
        mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))
    else:
        main_worker(0, ngpus_per_node, args)


def main_worker(gpu, ngpus_per_node, args):
    if args.distributed:
        if args.multiprocessing_distributed:
            args.rank = args.rank * ngpus_per_node + gpu
        dist.init_process_group(
            backend=args.dist_backend, init_method=args.dist_url, world_size=args.world_size, rank=args.rank
        )
    torch.manual_seed(0)

    traindir = os.path.join(args.data, "train")
    valdir = os.path.join(args.data, "val")
    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])

    train_dataset = datasets.ImageFolder(
        traindir,
        transforms.Compose(
            [
                transforms.RandomResizedCrop(64),
                transforms.RandomHorizontalFlip(),
                transforms.ToTensor(),
                normalize,
            ]
        ),
    )
    val_dataset = datasets.ImageFolder(
        valdir,
        transforms.Compose(
            [
                transforms.Resize(72),
                transforms.CenterCrop(64),
                transforms.ToTensor(),
                normalize,
            ]
        ),
    )

    if args.distributed:
        train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset)
        val_sampler = torch.utils.data.distributed.DistributedSampler(
            val_dataset, shuffle=False, drop_last=True
        )
    else:
        train_sampler = None
        val_sampler = None

    train_loader = torch.utils.data.DataLoader(
        train_dataset,
        batch_size=args.batch_size,
        shuffle=(train_sampler is None),
        num_workers=args.workers,
        pin_memory=True,
        sampler=train_sampler,
    )
    val_loader = torch.utils.data.DataLoader(
        val_dataset,
        batch_size=args.batch_size,
        shuffle=False,
        num_workers=args.workers,
        pin_memory=True,
        sampler=val_sampler,
    )

    model = nn.Sequential(
        nn.Conv2d(3, 8, 7, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(8, len(train_dataset.classes)),
    )  # fmt: skip
    if args.distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=0.9)

    for epoch in range(args.epochs):
        if args.distributed:
            train_sampler.set_epoch(epoch)
        seen = train(train_loader, model, criterion, optimizer)
        top1, counted = validate(val_loader, model, args)
        if args.rank in (-1, 0):
            print(f"epoch {epoch}: trained on {seen} samples; val {counted} samples, acc@1 {top1:.3f}")
    if args.distributed:
        dist.destroy_process_group()


def train(train_loader, model, criterion, optimizer):
    model.train()
    seen = 0
    for images, target in train_loader:
        loss = criterion(model(images), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        seen += len(target)
    return seen


def validate(val_loader, model, args):
    counts = torch.zeros(2)  # correct, seen

    def run_validate(loader):
        with torch.no_grad():
            for images, target in loader:
                counts[0] += (model(images).argmax(1) == target).sum()
                counts[1] += len(target)

    model.eval()
    run_validate(val_loader)
    if args.distributed:
        dist.all_reduce(counts)
    if args.distributed and (len(val_loader.sampler) * args.world_size < len(val_loader.dataset)):
        aux_val_dataset = Subset(
            val_loader.dataset, range(len(val_loader.sampler) * args.world_size, len(val_loader.dataset))
        )
        aux_val_loader = torch.utils.data.DataLoader(
            aux_val_dataset,
            batch_size=args.batch_size,
            shuffle=False,
            num_workers=args.workers,
            pin_memory=True,
        )
        run_validate(aux_val_loader)  # every rank counts the remainder, as main.py's meters do
    return (counts[0] / counts[1]).item(), int(counts[1])


if __name__ == "__main__":
    main()
