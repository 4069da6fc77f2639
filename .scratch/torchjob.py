import getpass, torch
print("USER", getpass.getuser(), flush=True)
model = torch.nn.Linear(4, 2)
opt = torch.optim.Adam(model.parameters(), lr=0.1)
loss = model(torch.ones(3, 4)).sum()
loss.backward()
opt.step()
f = torch.compile(lambda x: torch.sin(x) * 2 + 1)
print("COMPILED", f(torch.zeros(3)).tolist(), flush=True)
