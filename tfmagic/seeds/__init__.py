"""The seeds' between-graph programs, as %%tf_px cells (and as strings for tests).

Seed 000 (native distributed TensorFlow) ran ``python distribute.py
--ps_hosts=... --worker_hosts=... --job_name=... --task_index=...`` once per
task.  Here is the same program with only its flag parsing and its
``tf.train.Server(...)`` start-up removed: ``cluster``, ``job_name``,
``task_index`` and ``server`` come from tfmagic.  Its model is seed 004's
line y = 2x + 10 on tfmagic's ``Linear`` data (so the kernel-driven engine
can be compared on the very same examples).
"""

SEED_000 = """
import numpy as np
from tfmagic.training.models import Linear

tf.compat.v1.disable_eager_execution()   # the seeds are TF1 graph programs
tf.compat.v1.reset_default_graph()

issync = {issync}
steps, batch_size, learning_rate = {steps}, {batch_size}, {lr}
num_workers = len(cluster.job_tasks("worker"))

if job_name == "ps":
    server.join()
elif job_name == "worker":
    x_shard, y_shard = Linear().data.shard(task_index, num_workers)
    with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
            worker_device="/job:worker/task:%d" % task_index, cluster=cluster)):
        global_step = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, 1])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        weight = tf.compat.v1.get_variable("weight", [1, 1], initializer=tf.compat.v1.zeros_initializer())
        bias = tf.compat.v1.get_variable("bias", [1], initializer=tf.compat.v1.zeros_initializer())
        loss_value = tf.reduce_mean(tf.square(tf.matmul(x, weight) + bias - y))
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(learning_rate)
        grads_and_vars = optimizer.compute_gradients(loss_value)
        if issync:
            rep_op = tf.compat.v1.train.SyncReplicasOptimizer(
                optimizer, replicas_to_aggregate=num_workers, total_num_replicas=num_workers, use_locking=True)
            train_op = rep_op.apply_gradients(grads_and_vars, global_step=global_step)
        else:
            train_op = optimizer.apply_gradients(grads_and_vars, global_step=global_step)
    is_chief = task_index == 0
    # SyncReplicasOptimizer's hook runs the chief queue runner and the init tokens
    hooks = [rep_op.make_session_run_hook(is_chief)] if issync else []
    hooks.append(tf.compat.v1.train.StopAtStepHook(last_step=steps))
    k = 0
    with tf.compat.v1.train.MonitoredTrainingSession(master=server.target, is_chief=is_chief, hooks=hooks) as sess:
        while not sess.should_stop():
            idx = (k * batch_size + np.arange(batch_size)) % len(x_shard)
            _, loss, step = sess.run([train_op, loss_value, global_step],
                                     feed_dict={{x: x_shard[idx], y: y_shard[idx]}})
            report(step=step, loss=loss)
            k += 1
    with tf.compat.v1.Session(server.target) as plain:   # the variables live on the ps
        final_w, final_b = plain.run([weight, bias])
    print("worker %d: %d local steps, w = %.4f, b = %.4f" % (task_index, k, final_w[0][0], final_b[0]))
"""


def seed_000(issync: bool = True, steps: int = 40, batch_size: int = 16, lr: float = 0.1) -> str:
    """Seed 000's program for ``%%tf_px`` (sync with SyncReplicasOptimizer, or async)."""
    return SEED_000.format(issync=issync, steps=steps, batch_size=batch_size, lr=lr)


ALLREDUCE = """
import time
import numpy as np
from tfmagic.training.models import Linear

steps, batch_size, learning_rate = {steps}, {batch_size}, {lr}
x_shard, y_shard = Linear().data.shard(task_index, strategy.num_replicas_in_sync)
with strategy.scope():
    # MEAN: each replica's update is averaged over the workers by all-reduce
    weight = tf.Variable(tf.zeros([1, 1]), aggregation=tf.VariableAggregation.MEAN)
    bias = tf.Variable(tf.zeros([1]), aggregation=tf.VariableAggregation.MEAN)

@tf.function
def train_step(xb, yb):
    def replica(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(xb, weight) + bias - yb))
        gw, gb = tape.gradient(loss, [weight, bias])
        weight.assign_sub(learning_rate * gw)
        bias.assign_sub(learning_rate * gb)
        return loss
    return strategy.run(replica, args=(xb, yb))

t0 = time.time()
for k in range(steps):
    idx = (k * batch_size + np.arange(batch_size)) % len(x_shard)
    loss = train_step(tf.constant(x_shard[idx]), tf.constant(y_shard[idx]))
    report(step=k + 1, loss=float(loss))
allreduce_seconds = time.time() - t0
final_w, final_b = weight.numpy(), bias.numpy()
print("worker %d: w = %.4f, b = %.4f after %d all-reduce steps in %.2f s"
      % (task_index, final_w[0][0], final_b[0], steps, allreduce_seconds))
"""


def allreduce(steps: int = 150, batch_size: int = 16, lr: float = 0.1) -> str:
    """The same linear fit with MultiWorkerMirroredStrategy (``strategy`` from collective mode)."""
    return ALLREDUCE.format(steps=steps, batch_size=batch_size, lr=lr)
