"""The frameworks users already train with run over the backend, with gloo's losses
(issue 38, item 5): Lightning's ``DDPStrategy(process_group_backend="collectives")``
and Hugging Face Accelerate (on CPU: the process group made first, which Accelerate
then uses; see the README's "Lightning, Accelerate, torchrun").

Each script trains one small model for two epochs at 2 ranks under torchrun's
variables, once on gloo and once on "collectives", and the losses are compared. The
scripts import nothing of ours: the backend comes from torch's entry point.
"""
import importlib.util
import json

import pytest

import _autoload
from conftest import free_port, run_world

pytestmark = pytest.mark.timeout(300)

DATA = """
import os, torch
from torch.utils.data import DataLoader, TensorDataset
backend = os.environ["TEST_BACKEND"]
g = torch.Generator().manual_seed(1)
X = torch.randn(64, 8, generator=g)
Y = X.sum(1, keepdim=True) + 0.1 * torch.randn(64, 1, generator=g)
data = TensorDataset(X, Y)
torch.manual_seed(0)
"""

LIGHTNING = DATA + """
import lightning as L
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy

class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 1)
        self.losses, self.backends = [], set()

    def training_step(self, batch, i):
        x, y = batch
        loss = ((self.net(x) - y) ** 2).mean()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        self.losses.append(mean.item() / dist.get_world_size())
        self.backends.add(dist.get_backend())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

model = Model()
trainer = L.Trainer(accelerator="cpu", devices=2, max_epochs=2, logger=False,
                    strategy=DDPStrategy(process_group_backend=backend),
                    enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False)
trainer.fit(model, DataLoader(data, batch_size=8))
emit("trained", losses=model.losses, backends=sorted(model.backends),
     weight=model.net.weight.detach().flatten().tolist())
"""

ACCELERATE = DATA + """
import torch.distributed as dist
from accelerate import Accelerator
dist.init_process_group(backend)        # first: Accelerate uses the group it finds
accelerator = Accelerator(cpu=True)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
model, opt, loader = accelerator.prepare(model, opt, DataLoader(data, batch_size=8))
losses = []
for epoch in range(2):
    for x, y in loader:
        loss = ((model(x) - y) ** 2).mean()
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(accelerator.gather(loss.detach()).mean().item())
emit("trained", losses=losses, backends=[dist.get_backend()],
     processes=accelerator.num_processes,
     weight=accelerator.unwrap_model(model).weight.detach().flatten().tolist())
"""


def _train(script: str, backend: str, tmp_path) -> list:
    port = free_port()

    def torchrun(rank, n):
        return {"RANK": rank, "WORLD_SIZE": n, "LOCAL_RANK": rank, "LOCAL_WORLD_SIZE": n,
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    env = {"TEST_BACKEND": backend, **_autoload.autoload_env(tmp_path)}
    res = run_world(2, script, rank_env=torchrun, env=env, timeout=180).assert_ok()
    return [res[r].one("trained") for r in range(2)]


@pytest.mark.parametrize("framework,package", [("lightning", "lightning"),
                                               ("accelerate", "accelerate")])
def test_trains_as_on_gloo(framework, package, tmp_path):
    for need in ("torch", package):
        if importlib.util.find_spec(need) is None:
            pytest.skip(f"needs {need} (pip install 'collectives[frameworks]')")
    script = LIGHTNING if framework == "lightning" else ACCELERATE
    gloo = _train(script, "gloo", tmp_path)
    ours = _train(script, "collectives", tmp_path)
    for r in range(2):
        assert ours[r]["backends"] == ["collectives"], ours[r]
        assert gloo[r]["backends"] == ["gloo"], gloo[r]
        assert len(ours[r]["losses"]) == 8, ours[r]  # 2 epochs x 64 samples / 2 ranks / 8
        assert ours[r]["losses"] == gloo[r]["losses"], json.dumps([ours[r], gloo[r]])
        assert ours[r]["weight"] == gloo[r]["weight"]
        assert ours[r]["losses"][-1] < ours[r]["losses"][0]  # it trained
        if framework == "accelerate":
            assert ours[r]["processes"] == 2
