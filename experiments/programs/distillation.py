"""Knowledge distillation in the shape of keras.io's "Knowledge Distillation" example:
a convnet teacher trained on its own, then a Distiller (a keras.Model subclass whose
compute_loss runs the frozen teacher on each batch and mixes the KL divergence of the
softened outputs with the student's own loss), then the same student trained from
scratch for comparison. Three fits, three run folders: teacher, distiller, scratch.
"""

import keras
import numpy as np

import mpt

BATCH, STEPS, SIZE, CLASSES = 64, 30, 32, 10


def convnet(widths: tuple[int, ...], name: str) -> keras.Model:
  """A plain convnet: a 3x3 convolution per width, pooled between them."""
  layers = [keras.Input((SIZE, SIZE, 3))]
  for i, width in enumerate(widths):
    if i:
      layers.append(keras.layers.MaxPooling2D())
    layers.append(keras.layers.Conv2D(width, 3, padding="same", activation="relu"))
  return keras.Sequential(layers + [keras.layers.GlobalAveragePooling2D(),
                                    keras.layers.Dense(CLASSES, dtype="float32")],
                          name=name)


class Distiller(keras.Model):
  """The student, trained against labels and the frozen teacher's softened outputs."""

  def __init__(self, student: keras.Model, teacher: keras.Model, alpha=0.1,
               temperature=3.0):
    super().__init__(name="distiller")
    self.student, self.teacher = student, teacher
    self.alpha, self.temperature = alpha, temperature
    self.student_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    self.distill_loss = keras.losses.KLDivergence()

  def call(self, x, training=False):
    return self.student(x, training=training)

  def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None,
                   training=True):
    guidance = self.teacher(x, training=False)
    t = self.temperature
    soft = self.distill_loss(keras.ops.softmax(guidance / t, axis=1),
                             keras.ops.softmax(y_pred / t, axis=1)) * t ** 2
    return self.alpha * self.student_loss(y, y_pred) + (1 - self.alpha) * soft


def main(run_dir: str) -> dict:
  rng = np.random.default_rng(0)
  x = rng.random((BATCH * STEPS, SIZE, SIZE, 3), dtype=np.float32)
  y = rng.integers(0, CLASSES, len(x))
  fit = lambda model, name: model.fit(
      x, y, batch_size=BATCH, epochs=1, verbose=0,
      callbacks=mpt.callbacks(f"{run_dir}/{name}", batch_size=BATCH, diagnose=True))
  teacher = convnet((128, 256, 256), "teacher")
  teacher.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  fit(teacher, "teacher")
  teacher.trainable = False
  distiller = Distiller(convnet((16, 32), "student"), teacher)
  distiller.compile("adam")
  fit(distiller, "distiller")
  scratch = convnet((16, 32), "student")
  scratch.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  fit(scratch, "scratch")
  return {"runs": ["teacher", "distiller", "scratch"]}
