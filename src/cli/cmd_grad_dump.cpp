// `moetrain grad-dump --checkpoint DIR --out FILE`: loads a checkpoint, runs forward and backward on the next
// training batch, and writes the batch, the loss and every parameter gradient to a safetensors file. The
// PyTorch reference (tools/reference/check_parity.py) recomputes them independently.
#include "cli/commands.h"
#include "parallel/comm.h"
#include "train/checkpoint_io.h"
#include "train/safetensors.h"
#include "train/trainer.h"

namespace mt::cli {

void register_grad_dump(CLI::App& app) {
    auto* cmd = app.add_subcommand("grad-dump", "write one batch, its loss and all gradients for a checkpoint");
    auto dir = std::make_shared<std::string>();
    auto out = std::make_shared<std::string>();
    auto overrides = std::make_shared<std::vector<std::string>>();
    cmd->add_option("--checkpoint", *dir, "checkpoint directory")->required();
    cmd->add_option("--out", *out, "output .safetensors file")->required();
    cmd->add_option("--set", *overrides, "override a value of the checkpoint's config: section.key=value");
    cmd->callback([dir, out, overrides]() {
        const train::Checkpoint ckpt = train::checkpoint_open(*dir);
        // One process reads any checkpoint: the saved mesh's data-parallel size gives way to this process.
        std::vector<std::string> sets = {"parallel.dp=0"};
        sets.insert(sets.end(), overrides->begin(), overrides->end());
        const auto self = parallel::comm_make_self();
        train::Trainer trainer(
            train::config_parse(train::config_upgrade_saved(ckpt.manifest().at("config_toml").get<std::string>()),
                                *dir + "/manifest.json",
                                sets),
            false,
            self.get());
        trainer.load_checkpoint(*dir);
        const auto& t = trainer.config().train;
        core::Tensor inputs = core::Tensor::zeros({t.batch_size, t.seq_len}, core::DType::i32);
        core::Tensor targets = core::Tensor::zeros({t.batch_size, t.seq_len}, core::DType::i32);
        trainer.fill_batch(trainer.step(), 0, inputs, targets);
        nn::Model& model = trainer.model();
        model.params().zero_grads();
        const double loss = model.forward(inputs, targets);
        // The run's loss scale (fp16: the dynamic scale of the checkpoint), divided out of the dumped gradients.
        const double scale = trainer.loss_scale();
        model.backward(scale);
        core::Tensor loss_t = core::Tensor::zeros({1}, core::DType::f32);
        loss_t.fill(loss);
        std::vector<std::pair<std::string, core::Tensor>> tensors = {
            {"inputs", inputs}, {"targets", targets}, {"loss", loss_t}};
        for (int i = 0; i < model.params().size(); ++i) {
            core::Tensor g = model.params().grad(i).to_device(core::Device::cpu).to(core::DType::f32);
            float* p = g.data<float>();
            for (int64_t k = 0; k < g.numel(); ++k) p[k] = static_cast<float>(p[k] / scale);
            tensors.push_back({"grad/" + model.params().spec(i).name, g});
        }
        train::safetensors_write(
            *out, tensors, {{"format", "moetrain-grad-dump"}, {"checkpoint", *dir}}, core::ExitCode::usage);
        fmt::print("moetrain: loss {:.6f}; wrote {} tensors to {}\n", loss, tensors.size(), *out);
    });
}

}  // namespace mt::cli
