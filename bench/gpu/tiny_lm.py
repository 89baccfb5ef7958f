"""The small Transformer language model the GPU checks train (fit_check.py, forecast_check.py):
4 encoder layers of width 512, 8 heads, a vocabulary of 8192, AdamW. `model_and_step(torch)`
builds it on the card and returns `step(batch, length)`: one training step on random tokens."""

D_MODEL, LAYERS, HEADS, VOCAB = 512, 4, 8, 8192


def model_and_step(torch):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(D_MODEL, HEADS, 4 * D_MODEL, batch_first=True)
    m = torch.nn.Sequential(torch.nn.Embedding(VOCAB, D_MODEL), torch.nn.TransformerEncoder(layer, LAYERS),
                            torch.nn.Linear(D_MODEL, VOCAB)).cuda()
    opt = torch.optim.AdamW(m.parameters())

    def step(batch, length):
        x = torch.randint(0, VOCAB, (batch, length), device="cuda")
        logits = m(x)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, VOCAB), x.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step
